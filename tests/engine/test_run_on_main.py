"""run_on_main: the other ranks wait as long as rank 0 works (past the beat timeout), get its
result or its error, and fail fast when rank 0 is gone."""

import os
import time

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from ppdist.engine.dist import DistEnv, DistributedError, run_on_main

WORLD = 2


def slow_result():
    time.sleep(2.5)  # 12 beats, and 2.5x the time a waiting rank tolerates without one
    return {"ap": 0.5}


def failing():
    raise ValueError("no ground truth")


def vanishing():
    os._exit(0)  # rank 0 is gone without a word


def worker(rank: int, store_path: str, out_dir: str, cases: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    env = DistEnv(rank=rank, world_size=WORLD)
    for case in cases.split(","):
        work = {"slow": slow_result, "fail": failing, "vanish": vanishing}[case]
        try:
            outcome = repr(run_on_main(work, env, "the test", interval_s=0.2, timeout_s=1.0))
        except (DistributedError, ValueError) as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        with open(os.path.join(out_dir, f"{case}{rank}.txt"), "w") as handle:
            handle.write(outcome)
    dist.destroy_process_group()


def outcomes(tmp_path, cases):
    mp.spawn(worker, args=(str(tmp_path / "store"), str(tmp_path), cases), nprocs=WORLD)
    files = [tmp_path / f"{case}{r}.txt" for case in cases.split(",") for r in range(WORLD)]
    return [path.read_text() if path.exists() else None for path in files]


@pytest.mark.slow
def test_others_wait_while_rank_0_works_and_get_its_result_or_its_error(tmp_path):
    slow0, slow1, fail0, fail1 = outcomes(tmp_path, "slow,fail")
    assert slow0 == slow1 == "{'ap': 0.5}"  # waited 2.5 s with a 1 s beat timeout
    assert fail0 == "ValueError: no ground truth"
    assert fail1 == "DistributedError: rank 0 failed during the test: ValueError: no ground truth"


@pytest.mark.slow
def test_a_vanished_rank_0_is_reported_not_waited_for(tmp_path):
    start = time.monotonic()
    rank0, rank1 = outcomes(tmp_path, "vanish")
    assert rank0 is None and rank1.startswith("DistributedError: rank 0 stopped answering during the test")
    assert time.monotonic() - start < 60
