"""Paddle weights files are read without Paddle, and a pickle that would run code is refused."""

import copyreg
import io
import os
import pickle

import numpy as np
import pytest

from ppdist.convert.weights.pdparams import (
    STRUCTURED_NAMES_KEY,
    UnsafePickleError,
    is_paddle_weights,
    load_pdparams,
    read_paddle_pickle,
)
from ppdist.errors import CheckpointError


class FakeDygraphTensor:
    """Stands in for paddle's eager Tensor: paddle.save reduces it to tuple((name, array))."""

    def __init__(self, name, array):
        self.name, self.array = name, array


class FakeLoDTensor:
    """Stands in for a LoDTensor: paddle.save reduces it to eval('data', {'data': array})."""

    def __init__(self, array):
        self.array = array


def paddle_style_dump(obj, path, protocol):
    """Pickle ``obj`` the way paddle.save's _pickle_save does (its reducers, its protocol range)."""
    with open(path, "wb") as handle:
        pickler = pickle.Pickler(handle, protocol)
        pickler.dispatch_table = copyreg.dispatch_table.copy()
        pickler.dispatch_table[FakeDygraphTensor] = lambda t: (tuple, ((t.name, t.array),))
        pickler.dispatch_table[FakeLoDTensor] = lambda t: (eval, ("data", {"data": t.array}))
        pickler.dump(obj)


@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_state_dict_of_arrays_with_name_table(tmp_path, protocol):
    weights = {
        "backbone.conv1._conv.weight": np.random.rand(8, 3, 3, 3).astype("float32"),
        "backbone.conv1._batch_norm._mean": np.zeros(8, "float32"),
        "head.fc.weight": np.arange(12, dtype="float64").reshape(3, 4),
        "step": np.array(7, dtype="int64"),
    }
    saved = dict(weights, **{STRUCTURED_NAMES_KEY: {k: f"param_{i}" for i, k in enumerate(weights)}})
    path = str(tmp_path / "model.pdparams")
    paddle_style_dump(saved, path, protocol)
    state = load_pdparams(path)
    assert set(state) == set(weights)
    for key, value in weights.items():
        assert state[key].dtype == value.dtype and np.array_equal(state[key], value)


def test_nested_tensor_forms_of_paddle_21_and_lodtensor(tmp_path):
    a, b = np.ones((2, 2), "float32"), np.full(3, 2.0, "float32")
    opt = {
        "fc.w_0_moment1_0": FakeDygraphTensor("fc.w_0_moment1_0", a),
        "fc.b_0_moment1_0": FakeLoDTensor(b),
        "LR_Scheduler": {"last_epoch": 10, "last_lr": 0.001},
    }
    path = str(tmp_path / "model.pdopt")
    paddle_style_dump(opt, path, 4)
    raw = read_paddle_pickle(path)
    assert raw["LR_Scheduler"] == {"last_epoch": 10, "last_lr": 0.001}
    state = load_pdparams(path)
    assert set(state) == {"fc.w_0_moment1_0", "fc.b_0_moment1_0"}
    assert np.array_equal(state["fc.w_0_moment1_0"], a) and np.array_equal(state["fc.b_0_moment1_0"], b)


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_a_pickle_that_calls_a_function_is_refused_before_the_call(tmp_path):
    marker = str(tmp_path / "pwned")
    path = str(tmp_path / "evil.pdparams")
    with open(path, "wb") as handle:
        pickle.dump({"w": np.zeros(2), "x": RunsCode(marker)}, handle, protocol=2)
    with pytest.raises(
        UnsafePickleError, match=r"evil.pdparams: refused: the file asks for (posix|os|nt)\.mkdir"
    ):
        load_pdparams(path)
    assert not os.path.exists(marker)


def test_eval_with_anything_but_paddles_form_is_refused(tmp_path):
    class EvilEval:
        def __reduce__(self):
            return (eval, ("__import__('os').getcwd()", {}))

    path = str(tmp_path / "evil.pdema")
    with open(path, "wb") as handle:
        pickle.dump({"w": EvilEval()}, handle, protocol=4)
    with pytest.raises(UnsafePickleError, match=r"evil.pdema: refused: eval called with"):
        load_pdparams(path)


def test_not_a_pickle_and_not_a_state_dict(tmp_path):
    garbage = tmp_path / "bad.pdparams"
    garbage.write_bytes(b"\x00\x01not a pickle")
    with pytest.raises(CheckpointError, match="bad.pdparams is not a Paddle weights file"):
        load_pdparams(str(garbage))
    listed = tmp_path / "list.pdparams"
    listed.write_bytes(pickle.dumps([np.zeros(1)], protocol=2))
    with pytest.raises(CheckpointError, match="holds a list, not a Paddle state dict"):
        load_pdparams(str(listed))
    with pytest.raises(CheckpointError, match="cannot read Paddle weights"):
        load_pdparams(str(tmp_path / "absent.pdparams"))
    assert (
        is_paddle_weights("a/b.PDPARAMS") and is_paddle_weights("x.pdema") and not is_paddle_weights("x.pt")
    )


def test_reader_never_imports_an_unlisted_module(tmp_path):
    path = str(tmp_path / "sneaky.pdparams")
    payload = io.BytesIO()
    # protocol-0 GLOBAL of a module that does not exist: refused by name, not by ImportError
    payload.write(b"cnot_a_module\nanything\n.")
    with open(path, "wb") as handle:
        handle.write(payload.getvalue())
    with pytest.raises(UnsafePickleError, match="asks for not_a_module.anything"):
        read_paddle_pickle(path)


def test_arrays_split_by_protocol_2_saving_are_joined(tmp_path):
    big = np.arange(24, dtype="float32").reshape(2, 3, 4)
    flat = big.reshape(-1)
    saved = {
        "small": np.ones(2, "float32"),
        "big@@.0": flat[:10],
        "big@@.1": flat[10:20],
        "big@@.2": flat[20:],
        "UnpackBigParamInfor@@": {
            "big": {"OriginShape": (2, 3, 4), "slices": ["big@@.0", "big@@.1", "big@@.2"]}
        },
    }
    path = str(tmp_path / "split.pdparams")
    paddle_style_dump(saved, path, 2)
    state = load_pdparams(path)
    assert set(state) == {"small", "big"} and np.array_equal(state["big"], big)
    del saved["big@@.2"]
    paddle_style_dump(saved, path, 2)
    with pytest.raises(CheckpointError, match="parameter big is split into slices that do not fit together"):
        load_pdparams(path)
