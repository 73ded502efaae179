"""Gradient accumulation (Global.accumulate_steps): an accumulated step is the step of N * K processes.

In one process, K micro-batches of B equal the step of K processes of B each; with BatchNorm
on running statistics (eval mode), that is also the step on the whole K * B batch, which is what
these tests compare against: CTC (a batch mean) and PP-YOLOE (a normaliser all-reduced over the
processes, ``ppdist.losses.normalizer``). The 2-process comparison under torchrun is in
tests/integration/test_accumulation_torchrun.py.
"""

import os

import pytest
import torch
from ppdist_testing import REPO, tiny_run_config
from step_testing import device_batch, step_trainer

from ppdist.config import load_config
from ppdist.data.build import build_dataloader
from ppdist.data.samplers import TrainBatchSampler
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.position import Layout
from ppdist.engine.resume import check_relayout_allowed
from ppdist.engine.setup import build_trainer
from ppdist.errors import CheckpointError, ConfigError

QUICKSTARTS = {
    "crnn": (os.path.join(REPO, "configs", "rec", "quickstart_synth.yml"), (32, 100)),
    "ppyoloe": (os.path.join(REPO, "configs", "det", "quickstart_synth.yml"), (128, 128)),
}


def halves(batch):
    return [
        {k: v[:2] if torch.is_tensor(v) else v for k, v in batch.items()},
        {k: v[2:] if torch.is_tensor(v) else v for k, v in batch.items()},
    ]


@pytest.mark.parametrize("epoch", [1, 200])  # PP-YOLOE: the ATSS and the TAL assigner
@pytest.mark.parametrize("task", sorted(QUICKSTARTS))
def test_two_micro_batches_give_the_gradient_and_update_of_the_whole_batch(task, epoch):
    path, size = QUICKSTARTS[task]
    config = load_config(path, ["Global.synthetic_data=null", "Optimizer.fused=false"])
    whole, accumulated = step_trainer(config, 4, size), step_trainer(config, 4, size)
    for trainer in (whole, accumulated):  # BatchNorm on running statistics: the split changes nothing else
        for module in trainer.model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.eval()
    batch = next(iter(whole.train_loader))
    whole_values, _ = whole.step(device_batch(whole, dict(batch), epoch))
    parts = [device_batch(accumulated, part, epoch) for part in halves(batch)]
    values, _ = accumulated.step(*parts)
    compared = 0
    for (name, p), q in zip(whole.model.named_parameters(), accumulated.model.parameters()):
        if p.grad is None:
            assert q.grad is None, name
            continue
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-7, msg=name)
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7, msg=name)
        compared += 1
    assert compared > 20
    assert "normalizer" not in values and values.keys() == whole_values.keys()
    if task == "crnn":  # the logged loss of a step is the mean over its micro-batches
        torch.testing.assert_close(values["loss"], whole_values["loss"], rtol=1e-5, atol=0)


@pytest.mark.parametrize("processes,accumulate", [(1, 2), (2, 2), (1, 3)])
def test_micro_batches_are_the_batches_of_n_times_k_processes(processes, accumulate):
    """Micro-batch m of rank r holds the samples rank r * K + m of N * K processes gets, also
    mid-epoch after a resume and in the padded last step."""
    for consumed in (0, 12):
        wide = []
        for rank in range(processes * accumulate):
            sampler = TrainBatchSampler(
                50, 4, rank, processes * accumulate, shuffle=True, seed=3, drop_last=False
            )
            sampler.set_epoch(2)
            sampler.set_position(consumed)
            wide.append(list(sampler))
        for rank in range(processes):
            sampler = TrainBatchSampler(
                50, 4, rank, processes, shuffle=True, seed=3, drop_last=False, accumulate_steps=accumulate
            )
            sampler.set_epoch(2)
            sampler.set_position(consumed)
            steps_left = sampler.remaining_batches()
            micro = list(sampler)
            assert len(micro) == steps_left * accumulate == len(wide[0]) * accumulate
            assert sampler.samples_per_step == 4 * processes * accumulate
            for step in range(len(wide[0])):
                for m in range(accumulate):
                    assert micro[step * accumulate + m] == wide[rank * accumulate + m][step]
            assert len(sampler) == sampler.steps_per_epoch * accumulate


class _CrashOnCall:
    """The loss, raising on its ``at``-th call (a process dying inside an accumulated step)."""

    def __init__(self, loss_fn, at: int) -> None:
        self.loss_fn, self.at, self.calls = loss_fn, at, 0
        self.host_keys = getattr(loss_fn, "host_keys", ())

    def __call__(self, preds, batch):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("killed mid-accumulation")
        return self.loss_fn(preds, batch)


@pytest.mark.slow
def test_a_run_killed_mid_accumulation_resumes_to_the_same_weights(tmp_path, digits_dir):
    setup_logger(None)
    common = ["Global.accumulate_steps=2", "Global.max_iters=10", "Global.save_iter_step=4"]
    straight = build_trainer(tiny_run_config(tmp_path, digits_dir, "straight", common), DistEnv())
    assert straight.position.layout.samples_per_step == 32 and straight.total_steps == 10
    straight.train()

    killed = build_trainer(
        tiny_run_config(tmp_path, digits_dir, "killed", common + ["Global.checkpoints=auto"]), DistEnv()
    )
    killed.loss_fn = _CrashOnCall(killed.loss_fn, at=2 * 5 + 2)  # micro-batch 2 of step 6
    with pytest.raises(RuntimeError, match="mid-accumulation"):
        killed.train()
    resumed = build_trainer(
        tiny_run_config(tmp_path, digits_dir, "killed", common + ["Global.checkpoints=auto"]), DistEnv()
    )
    assert resumed.position.global_step == 4 and resumed.position.epoch_consumed == 4 * 32
    resumed.train()
    assert resumed.position.global_step == 10 and resumed.scheduler.last_step == 10
    for (name, p), q in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(p, q), name
    saved = torch.load(tmp_path / "killed" / "latest.pt", weights_only=True)
    assert saved["position"]["accumulate_steps"] == 2 and saved["position"]["global_step"] == 10


def test_absurd_accumulate_steps_is_refused_by_the_config(tmp_path, digits_dir):
    with pytest.raises(
        ConfigError, match=r"Global.accumulate_steps must be .* at most 65536 .*, got 1000000000000"
    ):
        tiny_run_config(tmp_path, digits_dir, "run", ["Global.accumulate_steps=1000000000000"])


def test_accumulate_steps_larger_than_an_epoch_names_the_largest_that_works(tmp_path, digits_dir):
    """512 samples, batch 16, 1 process: 32 batches an epoch (was: DataError, exit 1, "lower
    batch_size_per_card or set drop_last: false", which does not help)."""
    config = tiny_run_config(tmp_path, digits_dir, "run", ["Global.accumulate_steps=40"])
    with pytest.raises(ConfigError) as info:
        build_dataloader(config, "Train", "train")
    message = str(info.value)
    assert info.value.exit_code == 2 and "\n" not in message
    assert "Global.accumulate_steps 40" in message and "largest Global.accumulate_steps that works" in message
    assert message.endswith(" is 32"), message
    config = tiny_run_config(tmp_path, digits_dir, "run", ["Global.accumulate_steps=32"])
    assert build_dataloader(config, "Train", "train").batch_sampler.steps_per_epoch == 1


def test_resume_with_another_accumulate_steps_names_it(tmp_path, digits_dir):
    saved = {"world_size": 1, "batch_size_per_card": 16, "accumulate_steps": 2, "steps_per_epoch": 16}
    layout = Layout(512, 16, 1, 8, accumulate_steps=4)
    with pytest.raises(CheckpointError) as info:
        check_relayout_allowed(saved, layout, {"auto_scale_lr": None}, "run/latest.pt")
    message = str(info.value)
    assert "Global.accumulate_steps 2" in message and "has 4" in message, message
    assert "the data or batch size changed" not in message


@pytest.mark.parametrize(
    "processes, accumulate, expected",
    [
        (1, 2, "global batch 64 (32 per process x 1 process(es) x 2 accumulated micro-batches)"),
        (4, 1, "global batch 128 (32 per process x 4 process(es))"),
    ],
)
def test_the_scaled_lr_line_names_the_accumulation_factor(monkeypatch, processes, accumulate, expected):
    """The auto_scale_lr line's global batch is per process x processes x micro-batches; the
    accumulation factor is named (issue 28: "global batch 64 (32 per process x 1)")."""
    from types import SimpleNamespace

    from ppdist.engine import setup

    lines = []
    monkeypatch.setattr(setup.logger, "info", lambda fmt, *args: lines.append(fmt % args))
    glob = {"auto_scale_lr": {"base_batch_size": 32}, "accumulate_steps": accumulate}
    sampler = SimpleNamespace(batch_size=32, samples_per_step=32 * processes * accumulate)
    trainer = SimpleNamespace(
        scheduler=SimpleNamespace(schedule=SimpleNamespace(base_lr=0.004)),
        env=SimpleNamespace(world_size=processes),
    )
    setup.log_lr_scaling(glob, trainer, sampler)
    assert len(lines) == 1 and expected in lines[0], lines
