"""The non-finite guard (Global.nan_policy): a diverged run stops naming the step and the last good
checkpoint and never overwrites it; ``skip`` leaves such steps out on every process. Non-finite
runs never report success (issue 28): a run of mostly skipped steps stops, a forward that poisons
the BatchNorm statistics is caught (and left out with ``skip``), no checkpoint or best model holds
a NaN/Inf tensor, and a divergence after a resume names the resumed checkpoint."""

import os

import pytest
import torch
from ppdist_testing import REPO, tiny_run_config
from step_testing import device_batch, step_trainer

from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.finite_state import nonfinite_tensors
from ppdist.engine.logger import setup_logger
from ppdist.engine.nonfinite import NonFiniteError
from ppdist.engine.setup import build_trainer
from ppdist.errors import ConfigError


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


class _FiniteLossOfInfInputs:
    """A finite loss of a forward on all-Inf images (as an OHEM loss that keeps no pixel can be):
    the loss and the gradients are finite, only the BatchNorm statistics of the forward are not."""

    def __init__(self, loss_fn, model) -> None:
        self.loss_fn, self.model = loss_fn, model
        self.host_keys = getattr(loss_fn, "host_keys", ())

    def __call__(self, preds, batch):
        return {"loss": sum(p.sum() for p in self.model.parameters()) * 0 + 1.0}


def _inf_batch(batch):
    return dict(batch, image=batch["image"] * float("inf"))


def _running_stats(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


@pytest.mark.parametrize("policy", ["skip", "stop"])
def test_a_forward_that_poisons_batchnorm_statistics_is_caught(policy):
    trainer, batches = poisoned_crnn_steps(policy)
    trainer.loss_fn = _FiniteLossOfInfInputs(trainer.loss_fn, trainer.model)
    trainer.step(batches[0])
    before = _running_stats(trainer.model)
    values, _ = trainer.step(_inf_batch(batches[1]))
    assert torch.isfinite(values["loss"])  # the loss alone would not tell
    if policy == "stop":
        with pytest.raises(NonFiniteError, match="the BatchNorm statistics are not finite at global_step 1"):
            trainer.check_finite()
        return
    after = _running_stats(trainer.model)
    assert all(torch.equal(before[k], after[k]) for k in before), "a skipped step moved the statistics"
    assert trainer.nonfinite.skipped == 1
    trainer.step(batches[2])
    assert not nonfinite_tensors(trainer.model.state_dict())


def test_a_run_that_skips_most_steps_stops_with_the_share(tmp_path, digits_dir):
    setup_logger(None)
    config = tiny_run_config(tmp_path, digits_dir, "skip", ["Global.max_iters=16", "Global.nan_policy=skip"])
    trainer = build_trainer(config, DistEnv())
    trainer.loss_fn = _Poisoned(trainer.loss_fn, trainer.model, loss_at=set(range(2, 17)))
    with pytest.raises(NonFiniteError) as caught:
        trainer.train()
    # log lines every 5 steps: the window judged at step 10 (at least 10 steps) had 9 left out
    assert (
        "left out 9 of the 10 steps from global_step 1 to 10 (90% > Global.max_skipped_step_ratio 0.5)"
        in str(caught.value)
    )
    assert trainer.position.global_step == 10


def test_a_short_run_is_judged_as_a_whole_and_a_ratio_of_1_never_stops(tmp_path, digits_dir):
    setup_logger(None)
    overrides = ["Global.max_iters=4", "Global.nan_policy=skip", "Global.eval_batch_epoch=null"]
    trainer = build_trainer(tiny_run_config(tmp_path, digits_dir, "short", overrides), DistEnv())
    trainer.loss_fn = _Poisoned(trainer.loss_fn, trainer.model, loss_at={2, 3, 4})
    with pytest.raises(NonFiniteError, match="left out 3 of the 4 steps from global_step 1 to 4"):
        trainer.train()
    assert not (tmp_path / "short" / "best_accuracy.pt").exists()  # judged before the final evaluation
    overrides += ["Global.max_skipped_step_ratio=1", "Global.overwrite=true"]
    trainer = build_trainer(tiny_run_config(tmp_path, digits_dir, "short", overrides), DistEnv())
    trainer.loss_fn = _Poisoned(trainer.loss_fn, trainer.model, loss_at={2, 3, 4})
    assert trainer.train()["skipped_steps"] == 3
    with pytest.raises(ConfigError, match=r"Global.max_skipped_step_ratio must lie in \[0, 1\]"):
        tiny_run_config(tmp_path, digits_dir, "bad", ["Global.max_skipped_step_ratio=.nan"])


def test_no_checkpoint_or_best_model_with_a_nonfinite_tensor(tmp_path, digits_dir):
    setup_logger(None)
    trainer = build_trainer(tiny_run_config(tmp_path, digits_dir, "run", ["Global.max_iters=4"]), DistEnv())
    trainer.save("latest")
    latest = str(tmp_path / "run" / "latest.pt")
    with torch.no_grad():  # a finite step whose update overflowed the weights
        next(trainer.model.parameters()).fill_(float("inf"))
    with pytest.raises(NonFiniteError) as caught:
        trainer.save("iter_step_4")
    message = str(caught.value)
    assert "the model is not finite at global_step 0: 1 tensor(s) hold NaN/Inf values (" in message
    assert "iter_step_4.pt is not written" in message
    assert f"the last good checkpoint is {latest} (global_step 0)" in message
    assert not (tmp_path / "run" / "iter_step_4.pt").exists()
    with pytest.raises(NonFiniteError, match="it is neither evaluated nor saved as the best"):
        trainer.hook("evaluation").evaluate(1)
    assert not (tmp_path / "run" / "best_accuracy.pt").exists()


def test_a_divergence_after_a_resume_names_the_resumed_checkpoint(tmp_path, digits_dir):
    setup_logger(None)
    first = build_trainer(tiny_run_config(tmp_path, digits_dir, "run", ["Global.max_iters=2"]), DistEnv())
    first.train()
    latest = str(tmp_path / "run" / "latest.pt")
    config = tiny_run_config(
        tmp_path, digits_dir, "run", ["Global.max_iters=8", f"Global.checkpoints={latest}"]
    )
    resumed = build_trainer(config, DistEnv())
    resumed.loss_fn = _Poisoned(resumed.loss_fn, resumed.model, loss_at={1})
    with pytest.raises(NonFiniteError) as caught:
        resumed.train()
    assert f"the last good checkpoint is {latest} (global_step 2)" in str(caught.value)
    assert "no checkpoint of this run was written" not in str(caught.value)


def test_predictions_that_are_not_finite_never_make_a_best_model(tmp_path, digits_dir, capsys):
    setup_logger(None)
    trainer = build_trainer(tiny_run_config(tmp_path, digits_dir, "run", ["Global.max_iters=4"]), DistEnv())
    # finite weights whose outputs overflow (as after a huge finite update): NaN predictions
    trainer.model.register_forward_hook(lambda module, inputs, output: output * float("nan"))
    evaluation = trainer.hook("evaluation")
    metrics = evaluation.evaluate(1)
    assert "acc" in metrics and evaluation.evaluator.last_nonfinite_batches == 7  # every batch of 51 samples
    assert evaluation.best == {} and not (tmp_path / "run" / "best_accuracy.pt").exists()
    log = capsys.readouterr().out
    assert "the model's predictions hold NaN/Inf values in 7 batch(es)" in log
    assert "eval at step 0: the predictions hold NaN/Inf values: not a best model" in log


def test_the_divergence_message_at_the_first_step_reads_as_one_piece_of_advice():
    trainer, batches = poisoned_crnn_steps("stop", loss_at={1})
    trainer.step(batches[0])
    with pytest.raises(NonFiniteError) as caught:
        trainer.check_finite()
    assert str(caught.value) == (
        "training diverged: the loss, the gradients or the BatchNorm statistics are not finite at global_step 1 "
        "(rank 0: loss: nan); nothing after it is saved; no checkpoint of this run was written before it: start "
        "the run again with a lower learning rate, with Global.grad_clip, or with Global.nan_policy: skip to "
        "leave such steps out"
    )
