"""Shared fixtures: the repo root on sys.path and small synthetic data sets."""

from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest
import torch

# pytest -n: the workers share the cores, one thread each (and the processes they start, through
# OMP_NUM_THREADS). Two workers of two threads each on 2 cores spin-wait on each other: the same
# tests took 3x the CPU time.
WORKER_THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else None
if WORKER_THREADS:
    os.environ.setdefault("OMP_NUM_THREADS", str(WORKER_THREADS))
    torch.set_num_threads(WORKER_THREADS)

# Under pytest -n (the README's command, with --dist loadfile: a file goes to one worker, so its
# module-scoped fixtures, some minutes of training, run once) the longest files start first, so
# that the last file a worker takes is a short one. Collection order otherwise.
LONGEST_FIRST = (  # the files over ~15 s on 2 cores, longest first (pytest.ini prints the slowest)
    "tests/test_docs_commands.py",
    "tests/integration/test_multinode_torchrun.py",
    "tests/integration/test_rec_torchrun.py",
    "tests/integration/test_seg_torchrun.py",
    "tests/engine/test_step_host_syncs.py",
    "tests/engine/test_trainer.py",
    "tests/integration/test_det_torchrun.py",
    "tests/benchmark/test_benchmark_tool.py",
    "tests/engine/test_amp.py",
    "tests/integration/test_accumulation_torchrun.py",
    "tests/test_launch.py",
    "tests/visualize/test_curves.py",
    "tests/test_cli.py",
    "tests/visualize/test_eval_pictures.py",
    "tests/engine/test_step_host_syncs_distributed.py",
    "tests/engine/test_paddle_step.py",
    "tests/test_tools.py",
    "tests/test_convert_weights_tool.py",
    "tests/convert/test_config_convert_tools.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        return next(
            (i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)),
            len(LONGEST_FIRST),
        )

    items.sort(key=rank)  # stable: the files keep their tests' order


REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
for _path in (REPO_ROOT, os.path.dirname(os.path.abspath(__file__))):
    if _path not in sys.path:
        sys.path.insert(0, _path)


@pytest.fixture(autouse=True)
def worker_threads() -> Iterator[None]:
    """Under pytest -n every test starts and ends with the worker's one thread, whatever a test (or
    the module-scoped fixture before it) set."""
    if WORKER_THREADS:
        torch.set_num_threads(WORKER_THREADS)
    yield
    if WORKER_THREADS:
        torch.set_num_threads(WORKER_THREADS)


@pytest.fixture(scope="session", autouse=True)
def index_cache_dir(tmp_path_factory) -> str:
    """Dataset index caches of this session (and of the processes it starts) go to a fresh folder."""
    folder = str(tmp_path_factory.mktemp("index_cache"))
    os.environ["PPDIST_CACHE_DIR"] = folder
    return folder


@pytest.fixture(scope="session")
def repo_root() -> str:
    return REPO_ROOT


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory) -> str:
    from ppdist.data.synthetic import generate_rec_dataset

    out = str(tmp_path_factory.mktemp("data") / "digits")
    generate_rec_dataset(out, num_train=512, num_val=51, seed=1, charset="0123456789", min_len=3, max_len=5)
    return out


@pytest.fixture(scope="session")
def digits_2k_dir(tmp_path_factory) -> str:
    """Enough digit strings for a tiny model to generalise to unseen ones in a few hundred steps."""
    from ppdist.data.synthetic import generate_rec_dataset

    out = str(tmp_path_factory.mktemp("data") / "digits2k")
    generate_rec_dataset(out, num_train=2048, num_val=51, seed=1, charset="0123456789", min_len=3, max_len=5)
    return out
