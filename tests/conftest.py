"""Shared fixtures: the repo root on sys.path and small synthetic data sets."""

from __future__ import annotations

import os
import sys

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n: the workers share the cores, one thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
for _path in (REPO_ROOT, os.path.dirname(os.path.abspath(__file__))):
    if _path not in sys.path:
        sys.path.insert(0, _path)


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
