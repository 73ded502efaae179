"""Faster R-CNN training steps on CUDA (fp32, bf16; the quick start and the seed's R50-vd FPN at
a COCO-like size): finite, and the device synchronises only for the proposal NMS's host reads
(``ops/nms.grouped_nms``: the group sizes and one per suppression round), each counted once by
the host-sync counter; the sampling, the targets and the losses read nothing."""

import os

import pytest
import torch
from cuda_testing import PRECISIONS, device_syncs, sync_warnings
from faster_rcnn_testing import CASCADE_R50_FPN, R50_VD_FPN
from ppdist_testing import REPO
from step_testing import device_batch, step_trainer

from ppdist.convert.configs.convert import load_config
from ppdist.engine.dist import DistEnv
from ppdist.utils.host_sync import HostSyncCounter

RECIPES = {  # (config, batch size, input size)
    "quickstart": (os.path.join(REPO, "configs", "det", "faster_rcnn_quickstart_synth.yml"), 8, (160, 160)),
    "r50_vd_fpn": (R50_VD_FPN, 2, (800, 1088)),
    "cascade_quickstart": (
        os.path.join(REPO, "configs", "det", "cascade_rcnn_quickstart_synth.yml"),
        8,
        (160, 160),
    ),
    "cascade_r50_fpn": (CASCADE_R50_FPN, 2, (800, 1088)),
}


def faster_rcnn_trainer(path, batch_size, size, overrides):
    """A trainer of ``path`` (ppdist's config or PaddleDetection's, converted) on synthetic batches."""
    config = load_config(path, ["Global.synthetic_data=null", *overrides])
    return step_trainer(
        config, batch_size, size, env=DistEnv(device=torch.device("cuda", torch.cuda.current_device()))
    )


def steps_reading_only_in_the_nms(trainer, count=3):
    """``count`` steps, the last one under the device's sync check and the host-sync counter:
    every host read comes from grouped_nms and every device sync is one of them."""
    batches = [device_batch(trainer, batch) for batch, _ in zip(trainer.train_loader, range(count))]
    for batch in batches[:-1]:
        trainer.step(batch)
    torch.cuda.synchronize()
    with HostSyncCounter() as counter, device_syncs() as caught:
        values, _ = trainer.step(batches[-1])
    assert counter.count > 0, counter.report()
    assert all(key.endswith("(grouped_nms)") for key in counter.summary()), counter.report()
    assert len(sync_warnings(caught)) == counter.count, (sync_warnings(caught), counter.report())
    torch.cuda.synchronize()
    assert torch.isfinite(values["loss"]).item()
    return values


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_faster_rcnn_step_on_cuda_reads_only_in_the_proposal_nms(recipe, precision):
    """Faster R-CNN and Cascade R-CNN (whose later stages add no read)."""
    path, batch_size, size = RECIPES[recipe]
    trainer = faster_rcnn_trainer(path, batch_size, size, PRECISIONS[precision])
    steps_reading_only_in_the_nms(trainer)
