"""With EMA and no SyncBatchNorm every rank evaluates the model rank 0 saves (BN buffers synced,
one broadcast per dtype)."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader

from ppdist.data.samplers import TrainBatchSampler
from ppdist.engine.dist import DistEnv
from ppdist.engine.ema import ModelEMA
from ppdist.engine.trainer import Trainer
from ppdist.engine.update import WeightUpdate

WORLD = 2


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))

    def forward(self, batch):
        return self.body(batch["image"])


def mean_loss(preds, batch):
    return {"loss": preds.mean()}


def stack_images(items):
    return {"image": torch.stack([item["image"] for item in items])}


def worker(rank: int, store_path: str, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        model = Net()
        ema = ModelEMA(model, decay=0.5)
        data = [{"image": torch.randn(3, 8, 8)} for _ in range(8)]
        loader = DataLoader(
            _Indexed(data),
            batch_sampler=TrainBatchSampler(8, 2, rank=rank, world_size=WORLD),
            collate_fn=stack_images,
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        env = DistEnv(rank=rank, world_size=WORLD)
        update = WeightUpdate(model, optimizer, scheduler, env=env, ema=ema)
        trainer = Trainer(
            model, mean_loss, optimizer, scheduler, loader, total_steps=2, env=env, update=update
        )
        with torch.no_grad():  # each rank's statistics differ, as without SyncBatchNorm
            model(({"image": torch.randn(4, 3, 8, 8) + rank}))
        ema.update(model)
        before = [b.clone() for b in ema.module.buffers()]
        calls = []
        broadcast = dist.broadcast
        dist.broadcast = lambda tensor, *args, **kwargs: (
            calls.append(tensor.dtype) or broadcast(tensor, *args, **kwargs)
        )
        try:
            trainer.sync_buffers()
        finally:
            dist.broadcast = broadcast
        buffers = {
            "calls": calls,
            "before": before,
            "model": [b.clone() for b in model.buffers()],
            "ema": [b.clone() for b in ema.module.buffers()],
        }
        gathered = [None] * WORLD
        dist.all_gather_object(gathered, buffers)
        if rank == 0:
            torch.save(gathered, out_path)
    finally:
        dist.destroy_process_group()


class _Indexed(list):
    """A list indexed by TrainBatchSampler's (index, epoch, ...) items."""

    def __getitem__(self, item):
        return list.__getitem__(self, item[0] if isinstance(item, tuple) else item)


@pytest.mark.slow
def test_sync_buffers_covers_the_ema_model(tmp_path):
    out = tmp_path / "buffers.pt"
    mp.spawn(worker, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD)
    rank0, rank1 = torch.load(out, weights_only=False)
    for kind in ("model", "ema"):
        for a, b in zip(rank0[kind], rank1[kind]):
            assert torch.equal(a, b), kind
    # the EMA statistics did differ before the sync (else the test would pass vacuously)
    assert not torch.equal(rank0["before"][0], rank1["before"][0])
    # 6 float buffers (model, EMA, EMA averages) and 2 counters: one broadcast per dtype
    assert sorted(map(str, rank0["calls"])) == ["torch.float32", "torch.int64"]
