"""A training step never makes the host wait for the device (docs/architecture.md, "The GPU never
waits").

One full step (forward, loss, backward, gradient clipping, optimizer, LR schedule, EMA) of each
recipe and quick start, counted with ``HostSyncCounter`` after two warm-up steps run under the
same counter (so it sees where the optimizer state and the loss scaler are created: torch keeps
a non-fused optimizer's step counts on the host). The expected counts are pinned: 0 everywhere,
except fp16 with torch's non-fused optimizers, whose ``GradScaler.step`` reads the overflow flag
(one sync, which is why ``Optimizer.fused`` is on by default with CUDA).
"""

import os

import pytest
from ppdist_testing import REPO
from step_testing import device_batch, step_trainer

from ppdist.config import load_config
from ppdist.utils.host_sync import HostSyncCounter


def config_path(*parts):
    return os.path.join(REPO, "configs", *parts)


RECIPES = {
    "crnn": (config_path("rec", "rec_mv3_none_bilstm_ctc.yml"), 8, (32, 100)),
    "ppocrv3": (config_path("rec", "PP-OCRv3", "ch_PP-OCRv3_rec_distillation.yml"), 2, (48, 320)),
    "ppyoloe": (config_path("det", "ppyoloe_crn_s_300e_coco.yml"), 2, (320, 320)),
    "pp_liteseg": (
        config_path("seg", "pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml"),
        2,
        (128, 256),
    ),
}
QUICKSTARTS = {
    "crnn": (config_path("rec", "quickstart_synth.yml"), 8, (32, 100)),
    "ppocrv3": (config_path("rec", "PP-OCRv3", "quickstart_synth.yml"), 2, (48, 320)),
    "ppyoloe": (config_path("det", "quickstart_synth.yml"), 4, (128, 128)),
    "pp_liteseg": (config_path("seg", "quickstart_synth.yml"), 4, (128, 128)),
}
AMP = {
    "fp32": [],
    "bf16": ["Global.use_amp=true", "Global.amp_dtype=bfloat16"],
    "fp16_fused": ["Global.use_amp=true", "Global.amp_dtype=float16", "Optimizer.fused=true"],
    "fp16": ["Global.use_amp=true", "Global.amp_dtype=float16", "Optimizer.fused=false"],
}
EXPECTED = {"fp32": 0, "bf16": 0, "fp16_fused": 0, "fp16": 1}


# the PP-OCRv3 quick start's dictionary is written with its data: the bundled English one stands in
QUICKSTART_DICT = "Global.character_dict_path=" + os.path.join(REPO, "ppdist", "data", "dicts", "en_dict.txt")


def counted_step(path, batch_size, size, overrides=(), epoch=1, nan_policy=None, micro_batches=1):
    """The host reads of a third step (of ``micro_batches`` accumulated micro-batches each)."""
    overrides = [QUICKSTART_DICT, *overrides] if "PP-OCRv3" in path and "quickstart" in path else overrides
    config = load_config(path, ["Global.synthetic_data=null", *overrides])
    trainer = step_trainer(config, batch_size, size, nan_policy=nan_policy)
    loaded = zip(trainer.train_loader, range(3 * micro_batches))
    batches = [device_batch(trainer, batch, epoch) for batch, _ in loaded]
    steps = [batches[i : i + micro_batches] for i in range(0, len(batches), micro_batches)]
    host = [batch[key] for batch in batches for key in trainer.host_keys]
    with HostSyncCounter(host=host) as counter:
        for step in steps[:2]:
            trainer.step(*step)
        counter.events.clear()
        values, _ = trainer.step(*steps[2])
    return counter, values


@pytest.mark.parametrize("task", sorted(RECIPES))
@pytest.mark.slow
def test_recipe_steps_read_nothing_on_the_host(task):
    counter, values = counted_step(*RECIPES[task])
    assert counter.count == 0, counter.report()
    assert float(values["loss"]) > 0


def test_ppyoloe_step_after_the_assigner_switch_reads_nothing_on_the_host():
    path, batch_size, size = RECIPES["ppyoloe"]
    epoch = load_config(path)["Loss"].get("static_assigner_epoch", 100) + 1
    counter, _ = counted_step(path, batch_size, size, epoch=epoch)
    assert counter.count == 0, counter.report()


# PP-OCRv3 in fp16 on the CPU: 45-50 s per case (torch's CPU fp16 LSTM and depthwise kernels), for
# the ops that the CRNN quick start's fp16 cases already count; fp32 and bf16 are counted
PRECISIONS = [
    (task, amp)
    for task in sorted(QUICKSTARTS)
    for amp in sorted(AMP)
    if task != "ppocrv3" or "fp16" not in amp
]


@pytest.mark.parametrize("task, amp", PRECISIONS)
@pytest.mark.slow
def test_quickstart_steps_read_nothing_on_the_host_at_every_precision(task, amp):
    counter, values = counted_step(*QUICKSTARTS[task], overrides=AMP[amp])
    assert counter.count == EXPECTED[amp], counter.report()
    assert float(values["loss"]) > 0


@pytest.mark.parametrize("task", sorted(QUICKSTARTS))
@pytest.mark.slow
def test_accumulated_steps_watched_for_non_finite_values_read_nothing_on_the_host(task):
    """Global.accumulate_steps (PP-YOLOE's step normaliser included) and nan_policy stop's
    device-side record add no host read."""
    counter, values = counted_step(*QUICKSTARTS[task], nan_policy="stop", micro_batches=2)
    assert counter.count == 0, counter.report()
    assert float(values["loss"]) > 0


def test_table_quickstart_step_reads_nothing_on_the_host():
    """SLANet's teacher-forced step (fp32: the head's GRU loop and SLALoss's masked terms are
    precision-independent in their reads; the other precisions are counted on the quick starts above)."""
    counter, values = counted_step(config_path("table", "quickstart_synth.yml"), 2, (128, 128))
    assert counter.count == 0, counter.report()
    assert float(values["loss"]) > 0


@pytest.mark.parametrize("name", ["quickstart_segformer_synth.yml", "quickstart_ocrnet_synth.yml"])
def test_seg_family_quickstart_steps_read_nothing_on_the_host(name):
    """SegFormer's and OCRNet's steps (fp32; the precisions are counted on PP-LiteSeg above)."""
    counter, values = counted_step(config_path("seg", name), 2, (96, 96))
    assert counter.count == 0, counter.report()
    assert float(values["loss"]) > 0


@pytest.mark.parametrize(
    "name, amp",
    [
        ("faster_rcnn_quickstart_synth.yml", "fp32"),
        ("faster_rcnn_quickstart_synth.yml", "bf16"),
        ("cascade_rcnn_quickstart_synth.yml", "fp32"),
        ("cascade_rcnn_quickstart_synth.yml", "bf16"),
    ],
)
def test_faster_rcnn_quickstart_step_reads_only_in_the_proposal_nms(name, amp):
    """Faster R-CNN's whole trainer step (also without the batch's im_shape: a synthetic batch
    takes the input's size, filled on the device) reads the host only in the proposal NMS
    (ops/nms.grouped_nms: the group sizes, then one read per suppression round). Cascade R-CNN's
    later stages (refined boxes clipped, empty ones masked, labelled without sampling) add none."""
    counter, values = counted_step(config_path("det", name), 4, (128, 128), AMP[amp])
    summary = counter.summary()
    assert counter.count > 0 and all(key.endswith("(grouped_nms)") for key in summary), counter.report()
    assert sum(n for key, n in summary.items() if key.startswith("Tensor.tolist()")) == 1, summary
    assert float(values["loss"]) > 0
