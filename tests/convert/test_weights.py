"""Paddle -> ppdist tensor mapping on the real paddle.save fixture (conv, BN, bi-LSTM, Linear)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

from ppdist.convert.weights import convert_state_dict, paddle_key_table
from ppdist.convert.weights.pdparams import load_pdparams

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle_io", "tiny.pdparams")


class Tiny(nn.Module):
    """The PyTorch twin of make_fixtures.py's Tiny layer."""

    def __init__(self, classes: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.lstm = nn.LSTM(4, 3, num_layers=1, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(6, classes)


@pytest.fixture(scope="module")
def paddle_state():
    return load_pdparams(FIXTURE)


def test_every_tensor_converted_with_paddle_layouts(paddle_state):
    state, report = convert_state_dict(Tiny(), paddle_state, FIXTURE)
    assert (
        report.complete and report.total == 16 and not report.unused
    )  # flat + per-cell LSTM aliases both taken
    np.testing.assert_array_equal(
        state["fc.weight"].numpy(), paddle_state["fc.weight"].T
    )  # Paddle: [in, out]
    np.testing.assert_array_equal(state["bn.running_mean"].numpy(), paddle_state["bn._mean"])
    np.testing.assert_array_equal(state["bn.running_var"].numpy(), paddle_state["bn._variance"])
    np.testing.assert_array_equal(
        state["lstm.weight_ih_l0_reverse"].numpy(), paddle_state["lstm.0.cell_bw.weight_ih"]
    )
    assert state["bn.num_batches_tracked"].dtype == torch.long  # PyTorch-only, kept from the model
    model = Tiny()
    model.load_state_dict(state)  # strict: nothing left out


def test_per_cell_lstm_names_alone_are_enough(paddle_state):
    """Files from older Paddle hold only one of the two LSTM name forms."""
    flat = {
        k: v
        for k, v in paddle_state.items()
        if not k.startswith("lstm.weight") and not k.startswith("lstm.bias")
    }
    state, report = convert_state_dict(Tiny(), flat, FIXTURE)
    assert report.complete
    np.testing.assert_array_equal(state["lstm.bias_hh_l0"].numpy(), paddle_state["lstm.0.cell_fw.bias_hh"])


def test_lstm_gates_compute_like_paddle(paddle_state):
    """Same gate order (i, f, g, o) as PyTorch: a step of the converted LSTM equals the equations
    evaluated on Paddle's per-cell arrays."""
    state, _ = convert_state_dict(Tiny(), paddle_state, FIXTURE)
    model = Tiny()
    model.load_state_dict(state)
    x = torch.randn(1, 1, 4)
    out, _ = model.lstm(x)
    w_ih, w_hh = paddle_state["lstm.0.cell_fw.weight_ih"], paddle_state["lstm.0.cell_fw.weight_hh"]
    gates = (
        x[0, 0].numpy() @ w_ih.T
        + paddle_state["lstm.0.cell_fw.bias_ih"]
        + paddle_state["lstm.0.cell_fw.bias_hh"]
    )
    i, f, g, o = np.split(gates, 4)
    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    hidden = sigmoid(o) * np.tanh(sigmoid(i) * np.tanh(g))
    assert w_hh.shape == (12, 3)
    np.testing.assert_allclose(out[0, 0, :3].detach().numpy(), hidden, atol=1e-6)


def test_class_count_change_is_skipped_and_listed(paddle_state):
    state, report = convert_state_dict(Tiny(classes=5), paddle_state, FIXTURE)
    assert sorted(report.skipped) == [
        "fc.bias: file (2,) (fc.bias) vs model (5,)",
        "fc.weight: file (6, 2) (fc.weight) vs model (5, 6)",
    ]
    assert "fc.weight" not in state and not report.missing
    text = "\n".join(report.lines())
    assert "skipped (shape mismatch) (2)" in text and "converted 14/16 tensors" in text


def test_missing_and_unused_are_listed(paddle_state):
    extra = dict(paddle_state, **{"head.extra.weight": np.zeros(3, np.float32)})
    extra.pop("conv.bias")
    _, report = convert_state_dict(Tiny(), extra, FIXTURE)
    assert report.missing == ["conv.bias"] and report.unused == ["head.extra.weight"]
    assert not report.complete


def test_fp16_files_are_upcast(paddle_state):
    half = {k: v.astype(np.float16) for k, v in paddle_state.items()}
    state, report = convert_state_dict(Tiny(), half, FIXTURE)
    assert report.complete and state["conv.weight"].dtype == torch.float32


def test_key_table_names_both_lstm_forms():
    table = dict(paddle_key_table(Tiny()))
    assert table["bn.running_var"] == ["bn._variance"]
    assert table["lstm.weight_hh_l0_reverse"] == ["lstm.weight_hh_l0_reverse", "lstm.0.cell_bw.weight_hh"]
