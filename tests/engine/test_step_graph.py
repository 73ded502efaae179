"""``Global.cuda_graph``: the captured training step equals the eager one, step after step (on the
CPU through the op-by-op replay, which has the CUDA graph's semantics: what the capture read from
Python stays, what is filled in place is read anew); a batch of another shape and a step that
reads the host are refused in one line; a captured run resumes exactly, with or without capture.
The same equality on a GPU: tests/cuda/test_cuda_step_graph.py."""

import functools
import os

import pytest
import torch
from ppdist_testing import REPO, StopAfterStep, tiny_seg_config
from step_testing import device_batch, step_trainer
from torch.utils.data import DataLoader

from ppdist.config import load_config
from ppdist.data.samplers import TrainBatchSampler
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.engine.setup import build_trainer
from ppdist.engine.trainer import Trainer
from ppdist.errors import ConfigError
from ppdist.utils.host_sync import HostSyncCounter


def config_path(*parts):
    return os.path.join(REPO, "configs", *parts)


SEG = config_path("seg", "quickstart_synth.yml")
CASES = {
    "pp_liteseg_ema_clip_stop": (SEG, 2, (64, 64), ["Global.use_ema=true", "Global.grad_clip=1.0"], "stop"),
    "pp_liteseg_skip": (SEG, 2, (64, 64), ["Global.use_ema=true"], "skip"),
    "ocrnet": (config_path("seg", "quickstart_ocrnet_synth.yml"), 2, (64, 64), [], None),
    "segformer_bf16": (
        config_path("seg", "quickstart_segformer_synth.yml"),
        2,
        (64, 64),
        ["Global.use_amp=true", "Global.amp_dtype=bfloat16"],
        None,
    ),
    "slanet": (config_path("table", "quickstart_synth.yml"), 2, (128, 128), ["Global.use_ema=true"], None),
    # the CTC losses read their lengths on the device with Global.cuda_graph (eager and captured alike)
    "crnn": (config_path("rec", "quickstart_synth.yml"), 8, (32, 100), ["Global.cuda_graph=true"], "stop"),
    "ppocrv3_distillation": (
        config_path("rec", "PP-OCRv3", "quickstart_synth.yml"),
        2,
        (48, 320),
        [
            "Global.cuda_graph=true",
            "Global.character_dict_path=" + os.path.join(REPO, "ppdist", "data", "dicts", "en_dict.txt"),
        ],
        None,
    ),
}
STEPS = 7  # 3 eager, the capture, 3 replays


def trained(path, batch_size, size, overrides, nan_policy, capture):
    """A trainer after ``STEPS`` steps on the same synthetic batches, and its loss terms."""
    config = load_config(path, ["Global.synthetic_data=null", "Optimizer.fused=true", *overrides])
    trainer = step_trainer(config, batch_size, size, steps=8, nan_policy=nan_policy, capture_step=capture)
    batches = [device_batch(trainer, batch) for batch in trainer.train_loader][:STEPS]
    losses = []
    for batch in batches:
        values, _ = trainer.step(batch)
        trainer.position.global_step += 1
        losses.append({name: value.item() for name, value in values.items()})
    return trainer, losses


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_captured_step_equals_the_eager_step(case):
    eager, eager_losses = trained(*CASES[case], capture=False)
    captured, captured_losses = trained(*CASES[case], capture=True)
    assert captured.step_graph.captured and captured.step_graph.capture.calls
    assert captured_losses == eager_losses
    for (name, a), b in zip(eager.model.state_dict().items(), captured.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert captured.scheduler.last_step == eager.scheduler.last_step == STEPS
    assert float(captured.optimizer.param_groups[0]["lr"]) == pytest.approx(
        eager.scheduler.get_lr(), rel=1e-15
    )
    if eager.ema is not None:  # the captured form keeps the EMA's count on the device: float64 vs host
        assert captured.ema.step == eager.ema.step == STEPS
        for (name, a), b in zip(
            eager.ema.module.state_dict().items(), captured.ema.module.state_dict().values()
        ):
            torch.testing.assert_close(b, a, rtol=0, atol=2e-6, msg=name)
    if eager.nonfinite is not None:
        assert captured.nonfinite.skipped == eager.nonfinite.skipped == 0
        assert captured.nonfinite.found(DistEnv()) is None


def test_replayed_steps_read_nothing_on_the_host():
    config = load_config(SEG, ["Global.synthetic_data=null", "Optimizer.fused=true", "Global.use_ema=true"])
    trainer = step_trainer(config, 2, (64, 64), steps=8, nan_policy="skip", capture_step=True)
    batches = [device_batch(trainer, batch) for batch in trainer.train_loader][:7]
    for batch in batches[:4]:  # eager, then the capture
        trainer.step(batch)
    with HostSyncCounter() as counter:
        for batch in batches[4:]:
            trainer.step(batch)
    assert counter.count == 0, counter.report()


def test_a_nonfinite_step_replayed_is_recorded_at_its_global_step():
    path, batch_size, size, overrides, _ = CASES["pp_liteseg_ema_clip_stop"]
    config = load_config(path, ["Global.synthetic_data=null", "Optimizer.fused=true", *overrides])
    trainer = step_trainer(config, batch_size, size, steps=8, nan_policy="stop", capture_step=True)
    batches = [device_batch(trainer, batch) for batch in trainer.train_loader][:6]
    batches[5]["image"][0, 0, 0, 0] = float("nan")  # the second replay
    for batch in batches:
        trainer.step(batch)
        trainer.position.global_step += 1
    step, terms, rank = trainer.nonfinite.found(DistEnv())
    assert (step, rank) == (6, 0) and terms["loss"] != terms["loss"]


def test_a_batch_of_another_shape_after_the_capture_is_refused_in_one_line():
    config = load_config(SEG, ["Global.synthetic_data=null", "Optimizer.fused=true"])
    trainer = step_trainer(config, 2, (64, 64), steps=8, capture_step=True)
    batches = [device_batch(trainer, batch) for batch in trainer.train_loader][:5]
    for batch in batches[:4]:
        trainer.step(batch)
    batches[4]["image"] = batches[4]["image"][..., :32]
    with pytest.raises(ConfigError) as info:
        trainer.step(batches[4])
    message = str(info.value)
    assert "\n" not in message
    assert (
        "the training batch's 'image' is 2x3x64x32 (float32), the captured step's 2x3x64x64 (float32)"
        in message
    )
    assert "set Global.cuda_graph: false" in message


class _ReadsTheHost:
    """A loss that reads its value on the host (as a step with a data-dependent shape does)."""

    def __init__(self, loss_fn):
        self.loss_fn = loss_fn

    def __call__(self, preds, batch):
        losses = self.loss_fn(preds, batch)
        losses["loss"] = losses["loss"] * (1.0 if float(losses["loss"]) > 0 else 0.0)
        return losses


def test_a_step_that_reads_the_host_cannot_be_captured_and_says_so():
    config = load_config(SEG, ["Global.synthetic_data=null", "Optimizer.fused=true"])
    trainer = step_trainer(config, 2, (64, 64), steps=8, capture_step=True)
    trainer.loss_fn = _ReadsTheHost(trainer.loss_fn)
    batches = [device_batch(trainer, batch) for batch in trainer.train_loader][:4]
    for batch in batches[:3]:  # eager warm-up steps may read the host
        trainer.step(batch)
    with pytest.raises(
        ConfigError, match=r"could not be captured \(the training step reads a tensor's value"
    ):
        trainer.step(batches[3])


def _captured_trainer_of(trainer, loader=None, **options):
    """A trainer of ``trainer``'s parts with the captured step (another loader, other options)."""
    return Trainer(
        trainer.model,
        trainer.loss_fn,
        trainer.optimizer,
        trainer.scheduler,
        loader or trainer.train_loader,
        total_steps=4,
        update=trainer.update,
        capture_step=True,
        **options,
    )


def test_accumulation_is_refused_by_the_trainer():
    config = load_config(SEG, ["Global.synthetic_data=null", "Optimizer.fused=true"])
    trainer = step_trainer(config, 2, (64, 64), steps=8)
    dataset = trainer.train_loader.dataset
    accumulating = DataLoader(
        dataset, batch_sampler=TrainBatchSampler(len(dataset), 2, seed=0, accumulate_steps=2)
    )
    with pytest.raises(ConfigError, match="accumulate_steps 2 is refused"):
        _captured_trainer_of(trainer, accumulating)


def test_an_autocast_that_caches_cast_weights_is_refused():
    config = load_config(SEG, ["Global.synthetic_data=null", "Optimizer.fused=true"])
    trainer = step_trainer(config, 2, (64, 64), steps=8)
    with pytest.raises(ValueError, match="autocast without its cache of cast weights"):
        _captured_trainer_of(trainer, autocast=functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16))


def _seg_run(tmp_path, name, overrides=(), hooks=()):
    data = str(tmp_path / "data")
    path = tiny_seg_config(str(tmp_path / f"{name}.yml"), data, str(tmp_path / name), max_iters=24)
    config = load_config(
        path,
        [
            "Train.loader.num_workers=0",
            "Global.save_iter_step=8",
            "Global.print_batch_step=4",
            "Global.checkpoints=auto",
            *overrides,
        ],
    )
    ensure_synthetic_data(config, DistEnv())
    return build_trainer(config, DistEnv(), hooks=hooks)


@pytest.mark.slow
def test_a_captured_run_resumes_exactly_with_or_without_capture(tmp_path):
    setup_logger(None)
    straight = _seg_run(tmp_path, "straight", ["Global.cuda_graph=true"])
    straight.train()
    assert straight.step_graph.captured and straight.scheduler.last_step == 24
    killed = _seg_run(tmp_path, "killed", ["Global.cuda_graph=true"], hooks=[StopAfterStep(13)])
    with pytest.raises(RuntimeError, match="killed"):
        killed.train()
    resumed = _seg_run(tmp_path, "killed", ["Global.cuda_graph=true"])
    assert resumed.position.global_step == 8
    resumed.train()
    eager = _seg_run(
        tmp_path, "eager", ["Global.cuda_graph=false", "Optimizer.fused=true"], hooks=[StopAfterStep(13)]
    )
    with pytest.raises(RuntimeError, match="killed"):
        eager.train()
    captured_after_eager = _seg_run(tmp_path, "eager", ["Global.cuda_graph=true"])
    captured_after_eager.train()
    captured = _seg_run(tmp_path, "captured", ["Global.cuda_graph=true"], hooks=[StopAfterStep(13)])
    with pytest.raises(RuntimeError, match="killed"):
        captured.train()
    eager_after_captured = _seg_run(tmp_path, "captured", ["Global.cuda_graph=false", "Optimizer.fused=true"])
    eager_after_captured.train()
    assert eager_after_captured.step_graph is None
    for run in (resumed, captured_after_eager, eager_after_captured):
        assert run.position.global_step == 24
        for (name, a), b in zip(straight.model.state_dict().items(), run.model.state_dict().values()):
            assert torch.equal(a, b), name


@pytest.mark.slow
def test_a_captured_bf16_run_resumes_an_fp16_run(tmp_path):
    """Every AMP setting resumes from every other: an fp16 run's checkpoint (its loss scaler's
    state in it) goes on as a captured bf16 run."""
    setup_logger(None)
    fp16 = [
        "Global.use_amp=true",
        "Global.amp_dtype=float16",
        "Optimizer.fused=true",
        "Global.save_iter_step=4",
    ]
    first = _seg_run(tmp_path, "amp", fp16, hooks=[StopAfterStep(5)])
    with pytest.raises(RuntimeError, match="killed"):
        first.train()
    assert torch.load(tmp_path / "amp" / "latest.pt", weights_only=True)["scaler"]  # fp16's scale and counts
    captured = _seg_run(
        tmp_path, "amp", ["Global.use_amp=true", "Global.amp_dtype=bfloat16", "Global.cuda_graph=true"]
    )
    assert captured.position.global_step == 4 and not captured.scaler.is_enabled()
    captured.train()
    assert captured.step_graph.captured and captured.position.global_step == 24
    assert all(torch.isfinite(v).all() for v in captured.model.state_dict().values() if v.is_floating_point())
