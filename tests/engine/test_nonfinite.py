"""The non-finite guard (Global.nan_policy): a diverged run stops naming the step and the last good
checkpoint and never overwrites it; ``skip`` leaves such steps out on every process."""

import os

import pytest
import torch
from ppdist_testing import REPO, tiny_run_config
from step_testing import device_batch, step_trainer

from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.nonfinite import NonFiniteError
from ppdist.engine.setup import build_trainer


class _Poisoned:
    """The loss, made non-finite on the calls in ``loss_at`` (NaN loss) and ``grad_at`` (a finite
    loss whose gradients are NaN)."""

    def __init__(self, loss_fn, model, loss_at=(), grad_at=()) -> None:
        self.loss_fn, self.model = loss_fn, model
        self.loss_at, self.grad_at, self.calls = set(loss_at), set(grad_at), 0
        self.host_keys = getattr(loss_fn, "host_keys", ())

    def __call__(self, preds, batch):
        self.calls += 1
        losses = dict(self.loss_fn(preds, batch))
        if self.calls in self.loss_at:
            losses["loss"] = losses["loss"] * float("nan")
        if self.calls in self.grad_at:  # d sqrt(x)/dx at 0 is inf: 0 * inf gradients are NaN
            losses["loss"] = losses["loss"] + torch.sqrt(next(self.model.parameters()).sum() * 0)
        return losses


def poisoned_crnn_steps(nan_policy, **poison):
    """A quick-start CRNN trainer with ``nan_policy``, its loss poisoned, and 3 device batches."""
    config = load_config(
        os.path.join(REPO, "configs", "rec", "quickstart_synth.yml"), ["Global.synthetic_data=null"]
    )
    trainer = step_trainer(config, 4, (32, 100), nan_policy=nan_policy)
    batches = [device_batch(trainer, batch) for batch, _ in zip(trainer.train_loader, range(3))]
    trainer.loss_fn = _Poisoned(trainer.loss_fn, trainer.model, **poison)
    return trainer, batches


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, digits_dir):
    setup_logger(None)
    config = tiny_run_config(tmp_path, digits_dir, "run", ["Global.max_iters=12", "Global.save_iter_step=4"])
    trainer = build_trainer(config, DistEnv())
    trainer.loss_fn = _Poisoned(trainer.loss_fn, trainer.model, loss_at={7})
    with pytest.raises(NonFiniteError) as caught:
        trainer.train()
    message = str(caught.value)
    latest = str(tmp_path / "run" / "latest.pt")
    assert "not finite at global_step 7 (rank 0: loss: nan)" in message
    assert f"the last good checkpoint is {latest} (global_step 4)" in message
    assert f"-o Global.checkpoints={latest}" in message
    assert trainer.position.global_step == 8  # refused at the save of step 8, before writing
    saved = torch.load(latest, weights_only=True)
    assert saved["position"]["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in saved["model"].values() if v.is_floating_point())


def test_nan_gradients_of_a_finite_loss_are_found_without_a_host_read_per_step():
    trainer, batches = poisoned_crnn_steps("stop", grad_at={2})
    trainer.step(batches[0])
    trainer.check_finite()  # nothing yet
    values, _ = trainer.step(batches[1])
    assert torch.isfinite(values["loss"])
    trainer.step(batches[2])
    with pytest.raises(NonFiniteError, match="not finite at global_step 1 .*no checkpoint of this run"):
        trainer.check_finite()  # the step counter is the run position's: step() alone does not advance it


def test_skip_leaves_the_step_out_and_the_run_goes_on(tmp_path, digits_dir, capsys):
    trainer, batches = poisoned_crnn_steps("skip", loss_at={2})
    trainer.step(batches[0])
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items() if v.is_floating_point()}
    moments = [s["exp_avg"].clone() for s in trainer.optimizer.state.values()]
    lr_step = trainer.scheduler.last_step
    trainer.step(batches[1])  # NaN: left out
    for (name, before), now in zip(weights.items(), (trainer.model.state_dict()[k] for k in weights)):
        if "running" not in name and "num_batches" not in name:  # the forward still ran
            assert torch.equal(before, now), name
    assert all(torch.equal(a, s["exp_avg"]) for a, s in zip(moments, trainer.optimizer.state.values()))
    assert trainer.scheduler.last_step == lr_step + 1 and trainer.nonfinite.skipped == 1
    trainer.step(batches[2])
    trainer.check_finite()  # a skipped step is not a reason to stop

    setup_logger(None)
    run = build_trainer(
        tiny_run_config(tmp_path, digits_dir, "skip", ["Global.max_iters=10", "Global.nan_policy=skip"]),
        DistEnv(),
    )
    run.loss_fn = _Poisoned(run.loss_fn, run.model, loss_at={3, 6})
    summary = run.train()
    assert run.position.global_step == 10 and summary["skipped_steps"] == 2
    log = capsys.readouterr().out  # a warning per log window (print_batch_step 5) that had some
    assert "skip: 1 step(s) with a non-finite loss or gradient left out up to global_step 5 (1 in" in log
    assert "skip: 1 step(s) with a non-finite loss or gradient left out up to global_step 10 (2 in" in log
    saved = torch.load(tmp_path / "skip" / "latest.pt", weights_only=True)
    assert saved["hooks"]["nonfinite"] == {"skipped": 2}
