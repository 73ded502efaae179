"""Frozen stages under DDP (2 gloo processes): DDP leaves the frozen parameters out of its buckets,
so no step waits for their gradients (find_unused_parameters off, static_graph on or off)."""

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ppdist.optim as optim
from ppdist.config.schema import GLOBAL_SCHEMA
from ppdist.engine.device_settings import broadcast_buffers
from ppdist.engine.dist import DistEnv
from ppdist.engine.setup import uses_sync_bn, wrap_for_training
from ppdist.modeling.backbones.cspresnet import CSPResNet

WORLD = 2
STEPS = 3


def train(static_graph: bool, rank: int) -> dict:
    """A few DDP steps of a CSPResNet with the stem and 2 stages frozen; its state before and after."""
    torch.manual_seed(0)
    model = CSPResNet(width_mult=0.25, depth_mult=0.33, frozen_stages=2)
    glob = {key: entry.default for key, entry in GLOBAL_SCHEMA.items()}
    glob["static_graph"] = static_graph
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = wrap_for_training(model, glob, DistEnv(rank=rank, world_size=WORLD))
    deprecations = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    forward_sync = getattr(wrapped, "forward_sync_buffers", getattr(wrapped, "broadcast_buffers", None))
    wanted = broadcast_buffers(glob, uses_sync_bn(glob, DistEnv(rank=rank, world_size=WORLD)))
    opt_cfg = {"name": "Momentum", "momentum": 0.9, "lr": 0.1, "regularizer": {"name": "L2", "factor": 0.01}}
    optimizer, scheduler = optim.build_optimizer(opt_cfg, model, epochs=1, step_each_epoch=STEPS)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(rank)  # each rank its own data
    for _ in range(STEPS):
        wrapped.train()
        outputs = wrapped(torch.randn(2, 3, 64, 64, generator=generator))
        sum(out.square().mean() for out in outputs).backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    return {
        "before": before,
        "after": model.state_dict(),
        "frozen": frozen,
        "deprecations": deprecations,
        "forward_sync": (forward_sync, wanted),
    }


def worker(rank: int, store_path: str, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    try:
        results = {static: train(static, rank) for static in (False, True)}
        gathered = [None] * WORLD
        dist.all_gather_object(gathered, results)
        if rank == 0:
            torch.save(gathered, out_path)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_trains_around_frozen_stages(tmp_path):
    out = tmp_path / "states.pt"
    mp.spawn(worker, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD)
    rank0, rank1 = torch.load(out, weights_only=False)
    for static in (False, True):
        first, second = rank0[static], rank1[static]
        # DDP built with the keyword this torch takes (no deprecation warning per process), with
        # the buffer re-sending that Global.broadcast_buffers asks for
        assert first["deprecations"] == [] and second["deprecations"] == []
        for got, wanted in (first["forward_sync"], second["forward_sync"]):
            assert isinstance(got, bool) and got == wanted
        frozen_modules = tuple(name.rsplit(".", 1)[0] + "." for name in first["frozen"])
        assert first["frozen"] and all(
            name.startswith(("stem.", "stages.0.", "stages.1.")) for name in first["frozen"]
        )
        for key, value in first["after"].items():
            if key.startswith(frozen_modules):  # weights and BatchNorm statistics, on both ranks
                assert torch.equal(value, first["before"][key]), (static, key)
                assert torch.equal(second["after"][key], first["before"][key]), (static, key)
            elif key.endswith(".weight"):  # trained, and the same on both ranks (gradients all-reduced)
                assert not torch.equal(value, first["before"][key]), (static, key)
                assert torch.allclose(value, second["after"][key], atol=1e-6), (static, key)
