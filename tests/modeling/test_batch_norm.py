"""StatisticsBatchNorm: Paddle's variance rule with the buffer stored scaled, read at its true value."""

import copy

import torch
from torch import nn

from ppdist.engine.ema import ModelEMA
from ppdist.engine.nonfinite import BufferRollback
from ppdist.modeling.batch_norm import BatchNorm2d
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

SHAPES = [(4, 3, 2, 2), (4, 3, 2, 2), (2, 3, 5, 5), (3, 3, 1, 1), (4, 3, 2, 2)]


def paddle_update(running_var, x):
    return 0.9 * running_var + 0.1 * x.double().var(dim=(0, 2, 3), unbiased=False)


def test_sizes_changing_or_not_follow_paddles_update_and_the_counter_stays():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3).train()
    apply_statistics_rule(bn, "paddle")
    assert isinstance(bn, BatchNorm2d) and isinstance(bn, nn.BatchNorm2d)
    expected = torch.ones(3, dtype=torch.float64)
    for shape in SHAPES:
        x = torch.randn(shape)
        bn(x)
        expected = paddle_update(expected, x)
        stored = bn._buffers["running_var"]
        count = shape[0] * shape[2] * shape[3]
        torch.testing.assert_close(stored.double(), expected * count / (count - 1), rtol=1e-6, atol=0)
    assert bn.variance_scale != 1.0
    torch.testing.assert_close(bn.running_var.double(), expected, rtol=1e-6, atol=0)
    assert bn.variance_scale == 1.0 and int(bn.num_batches_tracked) == 0


def scaled_module():
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(3).train()
    apply_statistics_rule(bn, "paddle")
    bn(torch.randn(4, 3, 2, 2))
    assert bn.variance_scale == 16 / 15
    return bn


def test_state_dict_evaluation_and_loading_see_the_true_value():
    bn = scaled_module()
    true = bn._buffers["running_var"] / bn.variance_scale
    torch.testing.assert_close(bn.state_dict()["running_var"], true)
    other = scaled_module()
    x = torch.randn(2, 3, 4, 4)
    reference = nn.BatchNorm2d(3).eval()
    reference.load_state_dict(bn.state_dict())
    torch.testing.assert_close(other.eval()(x), reference(x))
    loaded = scaled_module()
    state = {k: v.clone() + 1 if v.is_floating_point() else v for k, v in reference.state_dict().items()}
    loaded.load_state_dict(state)
    assert loaded.variance_scale == 1.0 and torch.equal(loaded.running_var, state["running_var"])
    replaced = scaled_module()
    replaced.running_var = torch.full((3,), 2.0)
    assert torch.equal(replaced.running_var, torch.full((3,), 2.0))


def test_torch_rule_leaves_torchs_batch_norm_as_it_is():
    bn = nn.BatchNorm2d(3)
    apply_statistics_rule(bn, "torch")
    assert type(bn) is nn.BatchNorm2d


def test_ema_averages_the_true_running_variance():
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)).train()
    apply_statistics_rule(model, "paddle")
    plain = copy.deepcopy(model)
    ema, reference = (
        ModelEMA(model, decay=0.5, decay_type="constant"),
        ModelEMA(plain, decay=0.5, decay_type="constant"),
    )
    torch.manual_seed(0)
    for shape in SHAPES[:3]:
        x = torch.randn(shape)
        model(x), plain(x)
        plain[1].running_var  # noqa: B018 - reading it stores the true value: the reference
        ema.update(model), reference.update(plain)
    assert model[1].variance_scale != 1.0
    torch.testing.assert_close(ema.average["1.running_var"], reference.average["1.running_var"])
    torch.testing.assert_close(ema.module[1].running_var, reference.module[1].running_var)


def test_a_skipped_step_puts_the_true_variance_back_across_a_size_change():
    bn = scaled_module()
    rollback = BufferRollback(bn)
    rollback.save()
    expected = bn._buffers["running_var"] / bn.variance_scale
    bn(torch.randn(2, 3, 5, 5))  # a new size: the stored value is rescaled to 50 / 49
    assert bn.variance_scale == 50 / 49
    rollback.restore_where(torch.tensor(True))
    torch.testing.assert_close(bn.running_var, expected, rtol=1e-6, atol=0)
