"""A 2-process training step of the detection recipe (PP-YOLOE-s: 78 BatchNorms, SyncBN, DDP,
Paddle's BN rule, EMA, a new input size every step) reads nothing on the host, on a gloo group.

torch's own SyncBatchNorm in its place (run on CPU with ``TorchKernelsOnCpu``) reads 3 values per
BatchNorm per step: the count this test pins for it says what ppdist's SyncBatchNorm removes."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ppdist_testing import REPO
from step_testing import device_batch, step_trainer, synthetic_sample
from sync_bn_testing import TorchKernelsOnCpu
from torch import nn

from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.setup import wrap_for_training
from ppdist.modeling.batch_norm_statistics import batch_norms
from ppdist.modeling.sync_batch_norm import SyncBatchNorm
from ppdist.utils.host_sync import HostSyncCounter

WORLD = 2
RECIPE = os.path.join(REPO, "configs", "det", "ppyoloe_crn_s_300e_coco.yml")
SIZES = ((160, 160), (192, 192), (128, 128))  # warm-up, warm-up, the counted step
BATCH = 2


def batches(trainer, rank):
    """One batch per size, different on every rank."""
    out = []
    for step, size in enumerate(SIZES):
        samples = [
            synthetic_sample(trainer.config, size, 100 * rank + BATCH * step + i) for i in range(BATCH)
        ]
        batch = {key: torch.stack([s[key] for s in samples]) for key in samples[0]}
        out.append(device_batch(trainer, batch))
    return out


def counted_step(rank, sync_bn):
    """Host reads of the third step of this rank, and how many BatchNorms synchronise."""
    config = load_config(RECIPE, ["Global.synthetic_data=null", "Global.use_ema=true"])
    env = DistEnv(rank=rank, world_size=WORLD)
    trainer = step_trainer(config, BATCH, SIZES[0], env=env)
    trainer.config = config
    trainer.train_model = wrap_for_training(trainer.model, config["Global"], env, input_sizes=len(SIZES))
    if sync_bn == "torch":  # torch's own SyncBatchNorm in place of ppdist's (DDP refuses it on CPU)
        for module in batch_norms(trainer.model).values():
            if isinstance(module, SyncBatchNorm):
                module.__class__ = nn.SyncBatchNorm
    steps = batches(trainer, rank)
    with HostSyncCounter() as counter:
        for batch in steps[:-1]:
            trainer.step(batch)
        counter.events.clear()
        trainer.step(steps[-1])
    synced = sum(isinstance(m, (SyncBatchNorm, nn.SyncBatchNorm)) for m in trainer.model.modules())
    return counter.count, counter.report(), synced


def worker(rank, store, out_path):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        ours = counted_step(rank, "ppdist")
        with TorchKernelsOnCpu():
            theirs = counted_step(rank, "torch")
        torch.save({"ppdist": ours, "torch": theirs}, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("det_sync_bn_step")
    mp.spawn(worker, args=(str(folder / "store"), str(folder / "out")), nprocs=WORLD)
    return [torch.load(f"{folder / 'out'}.{rank}", weights_only=False) for rank in range(WORLD)]


@pytest.mark.slow
def test_a_two_process_det_step_with_sync_bn_reads_nothing_on_the_host(counts):
    for per_rank in counts:
        reads, report, synced = per_rank["ppdist"]
        assert synced == 78
        assert reads == 0, report


def test_torchs_sync_batch_norm_reads_three_values_per_layer(counts):
    for per_rank in counts:
        reads, report, synced = per_rank["torch"]
        assert synced == 78
        assert reads == 3 * synced, report
