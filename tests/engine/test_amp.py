"""Mixed precision on every device: CPU autocast in CI, loss scaling, resume across AMP settings."""

import os

import pytest
import torch
from ppdist_testing import REPO
from step_testing import device_batch, step_trainer

from ppdist.config import load_config
from ppdist.engine.amp import load_scaler_state, make_autocast, make_grad_scaler

QUICKSTARTS = {
    "crnn": (os.path.join(REPO, "configs", "rec", "quickstart_synth.yml"), 8, (32, 100)),
    "ppyoloe": (os.path.join(REPO, "configs", "det", "quickstart_synth.yml"), 4, (128, 128)),
    "pp_liteseg": (os.path.join(REPO, "configs", "seg", "quickstart_synth.yml"), 4, (128, 128)),
}
SETTINGS = {
    "off": ["Global.use_amp=false"],
    "bf16": ["Global.use_amp=true", "Global.amp_dtype=bfloat16"],
    "fp16": ["Global.use_amp=true", "Global.amp_dtype=float16"],
}
GLOB = {"use_amp": True, "amp_dtype": "float16", "scale_loss": 1024.0, "use_dynamic_loss_scaling": True}


def quickstart_trainer(task, setting, *overrides):
    path, batch_size, size = QUICKSTARTS[task]
    config = load_config(path, ["Global.synthetic_data=null", *SETTINGS[setting], *overrides])
    return step_trainer(config, batch_size, size)


def test_cpu_autocast_is_used_instead_of_switching_amp_off():
    autocast, scale = make_autocast(dict(GLOB, amp_dtype="bfloat16"), torch.device("cpu"))
    with autocast():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not scale
    autocast, scale = make_autocast(GLOB, torch.device("cpu"))
    with autocast():
        assert torch.get_autocast_dtype("cpu") == torch.float16
    assert scale and make_grad_scaler(GLOB, scale, torch.device("cpu")).is_enabled()


def test_static_loss_scaling_keeps_its_scale_through_an_overflow():
    for dynamic, expected in ((True, 512.0), (False, 1024.0)):
        scaler = make_grad_scaler(dict(GLOB, use_dynamic_loss_scaling=dynamic), True, torch.device("cpu"))
        weight = torch.nn.Parameter(torch.ones(2))
        optimizer = torch.optim.SGD([weight], lr=1.0)
        scaler.scale((weight * torch.tensor([float("inf"), 1.0])).sum()).backward()
        scaler.step(optimizer)  # skipped: the gradient overflowed
        scaler.update()
        assert scaler.get_scale() == expected and torch.equal(weight.detach(), torch.ones(2))


@pytest.mark.parametrize("task", sorted(QUICKSTARTS))
@pytest.mark.slow
def test_every_task_trains_under_amp_with_the_loss_in_fp32_close_to_fp32(task):
    losses = {}
    for setting in SETTINGS:
        trainer = quickstart_trainer(task, setting, "Global.scale_loss=1024")
        batches = [device_batch(trainer, batch) for batch, _ in zip(trainer.train_loader, range(4))]
        before = [p.detach().clone() for p in trainer.model.parameters()]
        values, _ = trainer.step(batches[0])
        assert values["loss"].dtype == torch.float32, setting  # the loss ran outside autocast
        assert torch.isfinite(values["loss"])
        losses[setting] = float(values["loss"])
        for batch in batches[1:]:  # past the first LR warm-up step (and fp16's first scale)
            trainer.step(batch)
        changed = any(not torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))
        assert changed, f"{setting}: no parameter moved"
    # same initial weights and batch: the first loss differs only by the forward's precision
    assert losses["bf16"] == pytest.approx(losses["off"], rel=0.05)
    assert losses["fp16"] == pytest.approx(losses["off"], rel=0.01)


@pytest.mark.parametrize("saved", sorted(SETTINGS))
@pytest.mark.parametrize("resumed", sorted(SETTINGS))
@pytest.mark.slow
def test_every_amp_setting_resumes_from_every_other(saved, resumed):
    first = quickstart_trainer("crnn", saved, "Global.scale_loss=256")
    for batch, _ in zip(first.train_loader, range(2)):
        first.step(device_batch(first, batch))
        first.position.advance()
    state = first.state_dict()
    second = quickstart_trainer("crnn", resumed)
    second.load_state_dict(state)
    assert second.position.global_step == 2
    for name, value in first.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], value), name
    if resumed == "fp16":  # the saved scale when there was one, else the configured start
        assert second.scaler.get_scale() == (256.0 if saved == "fp16" else 65536.0)
    values, _ = second.step(device_batch(second, next(iter(second.train_loader))))
    assert torch.isfinite(values["loss"])


def test_an_empty_scaler_state_is_not_loaded_into_an_enabled_scaler(caplog):
    scaler = make_grad_scaler(GLOB, True, torch.device("cpu"))
    with caplog.at_level("INFO", logger="ppdist"):
        load_scaler_state(scaler, {}, "ckpt.pt")
    assert scaler.get_scale() == 1024.0 and "no fp16 loss-scaler state" in caplog.text
    disabled = make_grad_scaler(GLOB, False, torch.device("cpu"))
    load_scaler_state(disabled, {"scale": 8.0, "_growth_tracker": 0}, "ckpt.pt")  # ignored
    assert not disabled.is_enabled()
