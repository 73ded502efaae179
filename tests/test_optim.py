"""Optimizers, per-parameter L2 and LR schedules."""

import math

import pytest
import torch
from torch import nn

from ppdist.optim import (
    ConstLR,
    CosineLR,
    LinearLR,
    PiecewiseLR,
    build_optimizer,
    use_fused,
)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        for p in self.head.parameters():
            p.regularizer_factor = 0.5


def test_warmup_then_cosine_per_iteration():
    s = CosineLR(learning_rate=1.0, epochs=10, step_each_epoch=10, warmup_epoch=1)
    assert s.lr_at(0) == 0.0 and s.lr_at(5) == pytest.approx(0.5)
    assert s.lr_at(10) == pytest.approx(1.0)
    assert s.lr_at(10 + 50) == pytest.approx(0.5)
    assert s.lr_at(10 + 100) == pytest.approx(0.0, abs=1e-12)


def test_linear_piecewise_const():
    lin = LinearLR(learning_rate=1.0, epochs=2, step_each_epoch=5, end_lr=0.0)
    assert [round(lin.lr_at(i), 3) for i in (0, 5, 10)] == [1.0, 0.5, 0.0]
    pw = PiecewiseLR(step_each_epoch=10, decay_epochs=[2, 4], values=[0.1, 0.01, 0.001])
    assert (pw.lr_at(0), pw.lr_at(19), pw.lr_at(20), pw.lr_at(40)) == (0.1, 0.1, 0.01, 0.001)
    assert ConstLR(0.3, step_each_epoch=4, warmup_epoch=1).lr_at(2) == pytest.approx(0.15)


def test_per_parameter_l2_groups_and_coupled_decay():
    model = Tiny()
    cfg = {
        "name": "Adam",
        "lr": {"name": "Cosine", "learning_rate": 0.1},
        "regularizer": {"name": "L2", "factor": 0.01},
    }
    opt, sched = build_optimizer(cfg, model, epochs=2, step_each_epoch=3)
    decays = sorted(g["weight_decay"] for g in opt.param_groups)
    assert decays == [0.01, 0.5]
    assert isinstance(opt, torch.optim.Adam) and opt.param_groups[0]["lr"] == pytest.approx(0.1)
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi / 6)))


def test_momentum_matches_paddle_update():
    p = nn.Parameter(torch.tensor([1.0]))
    model = nn.Module()
    model.p = p
    opt, _ = build_optimizer({"name": "Momentum", "momentum": 0.9, "lr": 0.1}, model, 1, 1)
    v = 0.0
    expected = 1.0
    for _ in range(3):
        opt.zero_grad()
        (p * 2).sum().backward()
        opt.step()
        v = 0.9 * v + 2.0
        expected -= 0.1 * v
    assert p.item() == pytest.approx(expected)


def test_scheduler_state_round_trip():
    model = Tiny()
    opt, sched = build_optimizer({"name": "SGD", "lr": {"name": "Linear", "learning_rate": 1.0}}, model, 2, 5)
    for _ in range(3):
        sched.step()
    state = sched.state_dict()
    opt2, sched2 = build_optimizer(
        {"name": "SGD", "lr": {"name": "Linear", "learning_rate": 1.0}}, Tiny(), 2, 5
    )
    sched2.load_state_dict(state)
    assert sched2.get_lr() == sched.get_lr() == opt2.param_groups[0]["lr"] == pytest.approx(0.7)


def test_polynomial_decay_with_warmup_matches_paddleseg_recipe():
    from ppdist.optim import PolynomialDecayLR

    s = PolynomialDecayLR(
        learning_rate=0.005,
        total_steps=160000,
        step_each_epoch=186,
        end_lr=0.0,
        power=0.9,
        warmup_iters=1000,
        warmup_start_lr=1e-5,
    )
    assert s.lr_at(0) == pytest.approx(1e-5)
    assert s.lr_at(500) == pytest.approx(1e-5 + (0.005 - 1e-5) * 0.5)
    assert s.lr_at(1000) == pytest.approx(0.005)
    t = 81000
    assert s.lr_at(t) == pytest.approx(0.005 * (1 - (t - 1000) / 159000) ** 0.9)
    assert s.lr_at(160000) == pytest.approx(0.0, abs=1e-15)


def test_momentum_weight_decay_covers_every_parameter_and_total_steps_reach_schedule():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    opt_cfg = {
        "name": "Momentum",
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "lr": {"name": "PolynomialDecay", "learning_rate": 0.01, "power": 0.9},
    }
    optimizer, scheduler = build_optimizer(opt_cfg, model, epochs=3, step_each_epoch=7, total_steps=20)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [5e-4]
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 4  # conv w, b; bn w, b
    assert scheduler.schedule.decay_steps == 20
    with pytest.raises(Exception, match="not both"):
        build_optimizer(dict(opt_cfg, regularizer={"name": "L2", "factor": 1e-4}), model, 3, 7, 20)


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Momentum"])
def test_fused_optimizer_follows_the_config_and_the_device(name):
    model = Tiny()
    section = {"name": name, "lr": 0.1}
    optimizer, _ = build_optimizer(section, model, 1, 10)
    assert not optimizer.defaults.get("fused")  # CPU default: torch's default implementation
    optimizer, _ = build_optimizer(dict(section, fused=True), model, 1, 10)
    assert optimizer.defaults["fused"] and optimizer._step_supports_amp_scaling
    assert use_fused(None, torch.device("cuda", 0)) and not use_fused(None, torch.device("cpu"))


@pytest.mark.parametrize("fused", [False, True])
def test_a_skipped_first_momentum_step_leaves_the_buffer_zero(fused):
    """torch's fused SGD makes its momentum buffers with empty_like at its first step and leaves
    them unwritten when that step is skipped (an fp16 overflow: found_inf), so the next step read
    garbage (NaN here). ppdist makes them zero at build: the same first step (m * 0 + g = g),
    and a skipped one leaves them zero. The fp16 run equals torch's non-fused SGD's."""

    def trained(fused_setting):
        torch.manual_seed(0)
        model = nn.Linear(16, 16)
        optimizer, scheduler = build_optimizer(
            {"name": "Momentum", "lr": 0.01, "fused": fused_setting}, model, 1, 10
        )
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
        for step in range(4):
            optimizer.zero_grad()
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step)) * (1e4 if step == 0 else 1)
            with torch.autocast("cpu", dtype=torch.float16):
                y = model(x)
            scaler.scale(y.float().square().mean()).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            if step == 0:  # overflowed and skipped
                assert all(
                    torch.equal(s["momentum_buffer"], torch.zeros_like(p)) for p, s in optimizer.state.items()
                )
        return model

    found, reference = trained(fused), trained(False)
    assert all(torch.isfinite(p).all() for p in found.parameters())
    for a, b in zip(found.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
