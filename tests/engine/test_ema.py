"""EMA of parameters and buffers."""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ppdist.engine.ema import ModelEMA


def test_ema_averages_params_and_buffers():
    model = nn.BatchNorm1d(2)
    ema = ModelEMA(model, decay=0.5, decay_type="constant")
    with torch.no_grad():
        model.weight.fill_(3.0)
        model.running_mean.fill_(2.0)
    ema.update(model)  # from zeros: 0.5 * 3, corrected by 1 - 0.5
    assert torch.allclose(ema.module.weight, torch.full((2,), 3.0))
    assert torch.allclose(ema.module.running_mean, torch.full((2,), 2.0))
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model)  # (0.25 * 3 + 0.5 * 1) / (1 - 0.25)
    assert torch.allclose(ema.module.weight, torch.full((2,), 1.25 / 0.75))
    assert int(ema.module.num_batches_tracked) == int(model.num_batches_tracked)


def test_threshold_decay_ramps_and_state_round_trip():
    ema = ModelEMA(nn.Linear(1, 1), decay=0.9998, decay_type="threshold")
    assert ema.current_decay() == pytest.approx(0.1)
    ema.update(nn.Linear(1, 1))
    other = ModelEMA(nn.Linear(1, 1), decay=0.9998, decay_type="threshold")
    other.load_state_dict(ema.state_dict())
    assert other.step == 1 and torch.equal(other.module.weight, ema.module.weight)


def test_foreach_update_equals_the_per_tensor_formula_bit_for_bit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))
    ema = ModelEMA(model, decay=0.9, decay_type="threshold")
    average = {k: torch.zeros_like(v) for k, v in model.state_dict().items() if v.dtype.is_floating_point}
    for step in range(1, 4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model(torch.randn(2, 3, 8, 8))  # moves BN statistics and num_batches_tracked
        decay = ema.current_decay()
        reference = {}
        for name, value in model.state_dict().items():
            if value.dtype.is_floating_point:
                average[name].mul_(decay).add_(value, alpha=1.0 - decay)
                reference[name] = average[name] / (1.0 - decay**step)
            else:
                reference[name] = value
        ema.update(model)
        for name, value in ema.module.state_dict().items():
            assert torch.equal(value, reference[name]), name


def test_update_is_a_few_foreach_kernels_not_a_loop_over_tensors():
    model = nn.Sequential(*[nn.BatchNorm1d(4) for _ in range(50)])  # 50 x 5 state tensors
    ema = ModelEMA(model)
    ema.update(model)  # builds the cached lists
    with TorchDispatchCounter() as ops:
        ema.update(model)
    assert ops.count <= 5, ops.names  # average: mul, add; correction: div, copy; integers: copy


class TorchDispatchCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names = []

    @property
    def count(self) -> int:
        return len(self.names)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))
