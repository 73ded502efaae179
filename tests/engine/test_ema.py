"""EMA of parameters and buffers."""

import pytest
import torch
from torch import nn

from ppdist.engine.ema import ModelEMA


def test_ema_averages_params_and_buffers():
    model = nn.BatchNorm1d(2)
    ema = ModelEMA(model, decay=0.5)
    with torch.no_grad():
        model.weight.fill_(3.0)
        model.running_mean.fill_(2.0)
    ema.update(model)
    assert torch.allclose(ema.module.weight, torch.full((2,), 2.0))
    assert torch.allclose(ema.module.running_mean, torch.full((2,), 1.0))
    assert int(ema.module.num_batches_tracked) == int(model.num_batches_tracked)


def test_threshold_decay_ramps_and_state_round_trip():
    ema = ModelEMA(nn.Linear(1, 1), decay=0.9998, use_thres_step=True)
    assert ema.current_decay() == pytest.approx(0.1)
    ema.update(nn.Linear(1, 1))
    other = ModelEMA(nn.Linear(1, 1), decay=0.9998, use_thres_step=True)
    other.load_state_dict(ema.state_dict())
    assert other.step == 1 and torch.equal(other.module.weight, ema.module.weight)
