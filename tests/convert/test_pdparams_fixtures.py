"""Files written by real paddle.save (tests/fixtures/paddle_io, made by its make_fixtures.py with
paddlepaddle 3.3.1) read back bit for bit without Paddle."""

import os

import numpy as np
import pytest

from ppdist.convert.weights.pdparams import load_pdparams, read_paddle_pickle

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "paddle_io")


def reference(prefix):
    with np.load(os.path.join(FIXTURES, "reference.npz")) as data:
        return {k[len(prefix) :]: data[k] for k in data.files if k.startswith(prefix)}


@pytest.mark.parametrize("name", ["tiny.pdparams", "tiny_p2.pdparams", "nested.pdparams"])
def test_layer_state_dict_reads_back_exactly(name):
    expected = reference("param/")
    state = load_pdparams(os.path.join(FIXTURES, name))
    assert set(state) == set(expected)
    assert {"bn._mean", "bn._variance", "lstm.weight_ih_l0_reverse", "fc.weight"} <= set(state)
    for key, value in expected.items():
        assert state[key].dtype == value.dtype and np.array_equal(state[key], value), key


def test_optimizer_state_tensors_read_back_and_scheduler_state_is_kept_raw():
    expected = reference("opt/")
    state = load_pdparams(os.path.join(FIXTURES, "tiny.pdopt"))
    assert set(state) == set(expected) and len(state) > 20
    for key, value in expected.items():
        assert np.array_equal(state[key], value), key
    raw = read_paddle_pickle(os.path.join(FIXTURES, "tiny.pdopt"))
    assert "StructuredToParameterName@@" in raw


def test_paddle_round_trip_when_paddle_is_installed(tmp_path):
    """Optional: what we read equals paddle.load's own result."""
    paddle = pytest.importorskip("paddle")
    loaded = paddle.load(os.path.join(FIXTURES, "tiny.pdparams"), return_numpy=True)
    ours = load_pdparams(os.path.join(FIXTURES, "tiny.pdparams"))
    assert set(ours) == set(loaded) - {"StructuredToParameterName@@"}
    for key in ours:
        assert np.array_equal(ours[key], loaded[key])
