"""SARHead against PaddleOCR's own SARHead, and its contract in ppdist.

The fixtures (tests/fixtures/paddle_ppocrv3/sar_*.npz, written by make_sar_fixture.py beside them
with paddlepaddle 2.6.2 and PaddleOCR 2.7's rec_sar_head.py) hold the original's teacher-forced
training output, the gradient of a probe loss and the greedy eval decode, for PP-OCRv3's head (in
512, enc_dim 512, 25 steps, a (2, 512, 1, 40) map, valid ratios 1.0 and 0.6) and two small heads
with the other options (GRU, bidirectional encoder/decoder, no pred_concat, 3-row maps). Weights
are re-created from the fixture's seed and manifest and loaded through ppdist's Paddle converter.

Measured max abs differences (torch 2.14 CPU), PP-OCRv3 / GRU-bidirectional / LSTM cases:
training output 9.7e-6 / 8.6e-6 / 4.9e-6, input-feature gradient 1.4e-5 / 1.9e-5 / 1.5e-5 (of
gradients up to 13 / 54 / 17), eval probabilities 9.1e-7 / 1.5e-6 / 6.6e-7; parameter gradients
(small cases) within 1e-6 of each tensor's largest. Tolerance 1e-4 (parameter gradients: relative
to each tensor's largest, which reaches ~300).
"""

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
from ppdist_testing import paddle_fixture_dir

from ppdist.convert.weights import convert_state_dict
from ppdist.errors import ConfigError
from ppdist.modeling.heads.sar import SARHead, valid_widths
from ppdist.registry import HEADS
from ppdist.utils.host_sync import HostSyncCounter

TOLERANCE = 1e-4
FIXTURES = paddle_fixture_dir("ppocrv3")
CASES = ("sar_ppocrv3", "sar_small_gru_bi", "sar_small_lstm")


def fixture_script():
    spec = importlib.util.spec_from_file_location(
        "make_sar_fixture", os.path.join(FIXTURES, "make_sar_fixture.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FX = fixture_script()
with open(os.path.join(FIXTURES, "sar.json")) as _f:
    MANIFESTS = json.load(_f)


def arrays(name):
    with np.load(os.path.join(FIXTURES, f"{name}.npz")) as data:
        return {key: data[key] for key in data.files}


def paddle_state(name):
    return FX.synthetic_state(MANIFESTS[name]["tensors"], MANIFESTS[name]["seed"])


def batch_of(data):
    return {
        "label_sar": torch.from_numpy(data["label_sar"]),
        "valid_ratio": torch.from_numpy(data["valid_ratio"]),
    }


def max_diff(actual, expected):
    return float(np.abs(actual.detach().numpy() - expected).max())


@pytest.fixture(scope="module", params=CASES)
def case(request):
    """(name, head with the fixture's weights, arrays, conversion report)."""
    name = request.param
    torch.manual_seed(0)
    head = SARHead(**FX.CASES[name]["head"], **FX.NO_DROPOUT)
    state, report = convert_state_dict(head, paddle_state(name), name)
    head.load_state_dict(state, strict=True)
    return name, head, arrays(name), report


def test_paddle_weights_convert_completely_and_parameter_counts_match(case):
    name, head, _, report = case
    assert report.complete and not report.unused, report.lines()
    trainable = sum(p.numel() for p in head.parameters() if p.requires_grad)
    assert trainable == MANIFESTS[name]["trainable_parameters"]  # 11,371,048 for PP-OCRv3's head


def test_training_output_and_gradients_equal_paddle(case):
    name, head, data, _ = case
    head.train()
    head.zero_grad()
    feat = torch.from_numpy(data["feat"]).requires_grad_(True)
    out = head(feat, batch_of(data))
    assert out.shape == data["train_out"].shape
    assert max_diff(out, data["train_out"]) <= TOLERANCE
    (out * torch.from_numpy(data["probe"])).sum().backward()
    assert max_diff(feat.grad, data["grad_feat"]) <= TOLERANCE
    if not FX.CASES[name]["param_grads"]:
        return
    grads, report = convert_state_dict(
        head, {k[5:]: v for k, v in data.items() if k.startswith("grad/")}, name
    )
    assert report.complete, report.lines()
    params = dict(head.named_parameters())
    # relative to each tensor's largest gradient (up to ~300 here): 1e-6 is float32's rounding
    worst = max(
        max_diff(params[k].grad, v.numpy()) / max(1.0, float(v.abs().max())) for k, v in grads.items()
    )
    assert worst <= TOLERANCE
    # Paddle's padding index embeds to zeros and gets no gradient, whatever its stored row holds
    padding = head.decoder.padding_idx
    assert head.decoder.embedding.weight[padding].abs().sum() > 0
    assert torch.count_nonzero(head.decoder.embedding.weight.grad[padding]) == 0


def test_eval_decode_equals_paddle(case):
    name, head, data, _ = case
    head.eval()
    with torch.no_grad():
        probs = head(torch.from_numpy(data["feat"]), batch_of(data))
        assert probs.shape == data["eval_probs"].shape
        assert max_diff(probs, data["eval_probs"]) <= TOLERANCE
        if "eval_probs_no_ratio" in data:  # no batch: the whole width, as Paddle without targets
            assert max_diff(head(torch.from_numpy(data["feat"])), data["eval_probs_no_ratio"]) <= TOLERANCE


def test_valid_widths_use_fp32_products_like_paddle():
    ratio = torch.tensor([1.0, 0.6, 0.6, 0.01, 0.51], dtype=torch.float64)
    assert valid_widths(ratio[:2], 40, torch.device("cpu")).tolist() == [40, 24]  # 25 in fp64
    assert valid_widths(ratio[2:], 80, torch.device("cpu")).tolist() == [48, 1, 41]


@pytest.fixture(scope="module")
def small_head():
    torch.manual_seed(1)
    return SARHead(in_channels=8, out_channels=7, enc_dim=6, max_text_length=5, d_k=4)


def small_inputs(batch=3):
    generator = torch.Generator().manual_seed(2)
    feat = torch.randn(batch, 8, 2, 10, generator=generator)
    label = torch.randint(0, 7, (batch, 5), generator=generator)
    return feat, {"label_sar": label, "valid_ratio": torch.tensor([1.0, 0.45, 0.7])[:batch]}


def test_training_step_reads_nothing_on_the_host(small_head):
    small_head.train()
    feat, batch = small_inputs()
    with HostSyncCounter() as counter:
        out = small_head(feat, batch)
        out.square().mean().backward()
    assert counter.count == 0, counter.report()


def test_dropouts_act_in_training_only(small_head):
    feat, batch = small_inputs()
    small_head.train()
    torch.manual_seed(3)
    first = small_head(feat, batch)
    second = small_head(feat, batch)
    assert first.shape == (3, 5, 6) and not torch.allclose(first, second)
    small_head.eval()
    with torch.no_grad():
        assert torch.equal(small_head(feat, batch), small_head(feat, batch))


def test_initialisation_is_paddles(small_head):
    fresh = SARHead(in_channels=8, out_channels=7, enc_dim=6, max_text_length=5, d_k=4)
    decoder = fresh.decoder
    assert torch.count_nonzero(decoder.embedding.weight[decoder.padding_idx]) == 0
    for linear in (fresh.encoder.linear, decoder.conv1x1_1, decoder.prediction):
        fan_in, fan_out = linear.in_features, linear.out_features
        assert torch.count_nonzero(linear.bias) == 0
        assert linear.weight.abs().max() <= (6.0 / (fan_in + fan_out)) ** 0.5
    assert torch.count_nonzero(decoder.conv3x3_1.bias) == 0


def test_training_without_the_sar_label_names_the_missing_entries(small_head):
    small_head.train()
    feat, batch = small_inputs()
    with pytest.raises(KeyError, match=r"\['label_sar'\].*KeepKeys"):
        small_head(feat, {"valid_ratio": batch["valid_ratio"]})


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("out_channels", 2, r"SARHead.out_channels must be an integer >= 3"),
        ("enc_dim", 0, r"SARHead.enc_dim must be a positive integer, got 0"),
        ("pred_dropout", 1.0, r"SARHead.pred_dropout must be a probability in \[0, 1\), got 1.0"),
    ],
)
def test_bad_arguments_are_one_config_error(key, value, expected):
    config = {"name": "SARHead", "in_channels": 8, "out_channels": 7, key: value}
    with pytest.raises(ConfigError, match=r"Head \(SARHead\): " + expected):
        HEADS.build(config, where="Head")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_autocast_trains_and_decodes(dtype):
    torch.manual_seed(4)
    head = SARHead(in_channels=8, out_channels=7, enc_dim=6, max_text_length=5, d_k=4, **FX.NO_DROPOUT)
    feat, batch = small_inputs()
    reference = head(feat, batch).detach()
    with torch.autocast("cpu", dtype=dtype):
        out = head(feat.to(dtype), batch)
        head.eval()
        probs = head(feat.to(dtype), batch)
    out.float().sum().backward()
    assert out.dtype == dtype and torch.isfinite(probs).all()
    assert torch.allclose(probs.float().sum(-1), torch.ones(3, 5), atol=1e-2)
    assert (out.float() - reference).abs().max() < 0.05 * reference.abs().max()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters())
