"""ModelEMA against PaddleDetection's own ModelEMA (fixture: tests/fixtures/paddle_ema, made by
make_fixture.py with paddlepaddle 2.6.2 and PaddleDetection v2.7.0): zero start, bias correction
by the last decay, and the threshold / normal / exponential decay types."""

import os

import numpy as np
import pytest
import torch
from torch import nn

from ppdist.engine.ema import ModelEMA

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle_ema", "ema.npz")
KINDS = {"threshold": "threshold", "normal": "constant", "exponential": "exponential"}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.bn = nn.BatchNorm2d(3)


@pytest.mark.parametrize("paddle_kind", sorted(KINDS))
def test_applied_weights_equal_paddledetection_at_every_step(paddle_kind):
    data = np.load(FIXTURE)
    model = Net()
    ema = ModelEMA(model, decay=float(data[f"{paddle_kind}/decay"]), decay_type=KINDS[paddle_kind])
    step = 0
    while f"{paddle_kind}/{step}/model/conv.weight" in data:
        prefix = f"{paddle_kind}/{step}"
        with torch.no_grad():
            for name, value in model.state_dict().items():
                if value.dtype.is_floating_point:
                    value.copy_(torch.from_numpy(data[f"{prefix}/model/{name}"]))
        ema.update(model)
        for name, value in ema.module.state_dict().items():
            if value.dtype.is_floating_point:
                expected = torch.from_numpy(data[f"{prefix}/ema/{name}"])
                assert torch.allclose(value, expected, rtol=1e-5, atol=1e-6), (paddle_kind, step, name)
        step += 1
    assert step == 6


def test_resume_continues_the_average_exactly():
    torch.manual_seed(0)
    model = Net()
    whole = ModelEMA(model, decay=0.9998, decay_type="threshold")
    states = [
        {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in model.state_dict().items()}
        for _ in range(4)
    ]
    resumed = None
    for i, state in enumerate(states):
        model.load_state_dict(state)
        whole.update(model)
        if i == 1:
            resumed = ModelEMA(Net(), decay=0.9998, decay_type="threshold")
            resumed.load_state_dict(whole.state_dict())
        elif resumed is not None:
            resumed.update(model)
    for name, value in whole.module.state_dict().items():
        assert torch.equal(value, resumed.module.state_dict()[name]), name


def test_a_checkpoint_of_the_earlier_ema_resumes_from_its_average():
    model = Net()
    ema = ModelEMA(model, decay=0.9998, decay_type="threshold")
    legacy = {
        "module": {
            k: torch.full_like(v, 2.0) if v.is_floating_point() else v for k, v in model.state_dict().items()
        },
        "step": 3,
    }
    ema.load_state_dict(legacy)
    assert ema.step == 3 and ema.last_decay == pytest.approx(3 / 12)
    assert torch.allclose(ema.module.conv.weight, torch.full_like(ema.module.conv.weight, 2.0))
    with torch.no_grad():
        for value in model.state_dict().values():
            if value.is_floating_point():
                value.fill_(2.0)
    ema.update(model)  # Paddle's rule from the carried-over average: (d4 * a3 + (1 - d4) * 2) / (1 - d4 ** 4)
    d3, d4 = 3 / 12, 4 / 13
    expected = (d4 * 2.0 * (1 - d3**3) + (1 - d4) * 2.0) / (1 - d4**4)
    assert torch.allclose(ema.module.conv.weight, torch.full_like(ema.module.conv.weight, expected))
