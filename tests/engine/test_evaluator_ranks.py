"""Distributed evaluation computes the metric once, on rank 0, and every rank returns its result."""

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ppdist.engine.dist import DistEnv
from ppdist.engine.evaluator import Evaluator
from ppdist.metrics.base import Metric

WORLD = 2


class SumMetric(Metric):
    """Sum of the predictions; counts its own ``compute`` calls."""

    main_indicator = "total"

    def __init__(self) -> None:
        self.computed = 0
        self.reset()

    def reset(self) -> None:
        self.values = []

    def update(self, results, batch) -> None:
        self.values.extend(results.tolist())

    def state(self):
        return {"values": self.values}

    def load_states(self, states) -> None:
        self.values = [v for state in states for v in state["values"]]

    def compute(self):
        self.computed += 1
        return {"total": math.fsum(self.values), "count": len(self.values)}


def shard(rank: int):
    """Rank 0 gets three batches, rank 1 one (unequal, unpadded shards)."""
    data = torch.arange(8, dtype=torch.float32)
    parts = [data[:6].split(2), data[6:].split(2)]
    return [{"image": part} for part in parts[rank]]


def worker(rank: int, store_path: str, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    try:
        metric = SumMetric()
        env = DistEnv(rank=rank, world_size=WORLD)
        evaluator = Evaluator(shard(rank), lambda preds, batch: preds, metric, env)
        model = Doubler()
        metrics = evaluator.run(model)
        gathered = [None] * WORLD
        dist.all_gather_object(gathered, {"metrics": metrics, "computed": metric.computed})
        if rank == 0:
            torch.save(gathered, out_path)
    finally:
        dist.destroy_process_group()


class Doubler(nn.Module):
    def forward(self, batch):
        return batch["image"] * 2


@pytest.mark.slow
def test_metric_is_computed_on_rank_0_only_and_broadcast(tmp_path):
    out = tmp_path / "ranks.pt"
    mp.spawn(worker, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD)
    rank0, rank1 = torch.load(out, weights_only=False)
    assert rank0["computed"] == 1 and rank1["computed"] == 0
    single = Evaluator(
        [{"image": torch.arange(8, dtype=torch.float32)}], lambda p, b: p, SumMetric(), DistEnv()
    )
    expected = single.run(Doubler())
    assert rank0["metrics"] == rank1["metrics"] == expected == {"total": 56.0, "count": 8}
