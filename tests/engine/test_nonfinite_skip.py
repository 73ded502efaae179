"""``nan_policy: skip`` decided on the device: with an optimizer that takes ``found_inf`` (torch's
fused ones, ``Optimizer.fused: true``; the default with CUDA) a step reads nothing on the host,
skipped or not, and a skipped step is left out exactly — weights, optimizer state, BatchNorm
statistics (its forward ran), EMA — as if it had never been taken, but for the LR schedule."""

import os

import pytest
import torch
from ppdist_testing import REPO
from step_testing import device_batch, step_trainer

from ppdist.config import load_config
from ppdist.utils.host_sync import HostSyncCounter

CONFIGS = {  # Adam without EMA; Momentum with EMA (PaddleDetection's threshold decay)
    "crnn": (os.path.join(REPO, "configs", "rec", "quickstart_synth.yml"), 4, (32, 100)),
    "ppyoloe": (os.path.join(REPO, "configs", "det", "quickstart_synth.yml"), 2, (96, 96)),
}
POISONS = {
    "nan_loss": lambda batch: (batch, True),  # the loss made NaN after a clean forward
    "nan_input": lambda batch: (dict(batch, image=batch["image"] * float("nan")), False),  # NaN statistics
}


def trainer_and_batches(task, fused=True, overrides=()):
    path, batch_size, size = CONFIGS[task]
    options = ["Global.synthetic_data=null", f"Optimizer.fused={str(fused).lower()}", *overrides]
    trainer = step_trainer(load_config(path, options), batch_size, size, nan_policy="skip")
    batches = [device_batch(trainer, batch) for batch, _ in zip(trainer.train_loader, range(3))]
    return trainer, batches


class NanLoss:
    def __init__(self, loss_fn):
        self.loss_fn, self.poisoned = loss_fn, False
        self.host_keys = getattr(loss_fn, "host_keys", ())
        self.normalizer_floor = getattr(loss_fn, "normalizer_floor", 0.0)

    def __call__(self, preds, batch):
        losses = dict(self.loss_fn(preds, batch))
        if self.poisoned:
            losses["loss"] = losses["loss"] * float("nan")
        return losses


def state(trainer):
    """Everything a skipped step must leave as it was (deep copies)."""
    ema = trainer.ema
    return {
        "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": {
            i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for i, s in enumerate(trainer.optimizer.state.values())
        },
        "ema": None if ema is None else {k: v.clone() for k, v in ema.state_dict()["module"].items()},
        "ema_average": None if ema is None else {k: v.clone() for k, v in ema.average.items()},
        "ema_step": None if ema is None else (ema.step, ema.last_decay),
    }


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same(a[key], b[key])
        elif torch.is_tensor(a[key]):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def run(trainer, batches, poison=None):
    """Step 1, step 2 (poisoned unless ``poison`` is None: then not taken at all, only its LR
    step), step 3; the state before and after step 2 and the host reads of steps 2 and 3."""
    trainer.loss_fn = NanLoss(trainer.loss_fn)
    trainer.step(batches[0])
    before = state(trainer)
    host = [batch[key] for batch in batches for key in trainer.host_keys]  # CTC's lengths
    with HostSyncCounter(host=host) as counter:
        if poison is None:
            trainer.scheduler.step()
        else:
            batch, nan_loss = POISONS[poison](batches[1])
            trainer.loss_fn.poisoned = nan_loss
            trainer.step(batch)
            trainer.loss_fn.poisoned = False
    after_skip = state(trainer)  # (reads the EMA's step count on the host)
    with HostSyncCounter(host=host) as next_step:
        trainer.step(batches[2])
    counter.events += next_step.events
    return before, after_skip, counter


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("task", sorted(CONFIGS))
@pytest.mark.slow
def test_a_skipped_step_is_left_out_exactly_without_a_host_read(task, poison):
    trainer, batches = trainer_and_batches(task)
    before, after_skip, counter = run(trainer, batches, poison)
    assert counter.count == 0, counter.report()
    assert_same(before, after_skip)
    assert trainer.nonfinite.skipped == 1
    reference, batches = trainer_and_batches(task)
    run(reference, batches, poison=None)  # the same run with step 2 never taken
    assert_same(state(reference), state(trainer))
    assert trainer.scheduler.last_step == reference.scheduler.last_step == 3
    trainer.check_finite()  # a skipped step is no reason to stop


def test_without_found_inf_the_optimizer_needs_one_host_read_per_step_and_skips_alike():
    trainer, batches = trainer_and_batches("ppyoloe", fused=False)
    before, after_skip, counter = run(trainer, batches, "nan_input")
    assert counter.count == 2  # the flag, read at steps 2 and 3
    assert_same(before, after_skip)


def test_fp16_loss_scaling_skips_through_the_scaler_and_backs_its_scale_off():
    amp = ["Global.use_amp=true", "Global.amp_dtype=float16", "Global.scale_loss=1024"]
    trainer, batches = trainer_and_batches("crnn", overrides=amp)
    trainer.step(batches[0])
    scale = trainer.scaler.get_scale()
    before = state(trainer)
    trainer.loss_fn = NanLoss(trainer.loss_fn)
    trainer.loss_fn.poisoned = True
    trainer.step(batches[1])
    assert_same(before, state(trainer))
    assert trainer.scaler.get_scale() == scale / 2 and trainer.nonfinite.skipped == 1
