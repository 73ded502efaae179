"""index_range equals arange, and a traced one follows the input's size without naming a device;
the sizes and orders of exported graphs (size_of, at_most, kept_first, best_first) equal their eager
meaning, traced at one size and run at others."""

import warnings

import pytest
import torch

from ppdist.ops.ranges import at_most, best_first, index_range, is_graph_capture, kept_first, size_of


def test_index_range_is_arange_on_the_tensor_device_and_dtype():
    like = torch.zeros(3, dtype=torch.float16)
    assert torch.equal(index_range(5, like), torch.arange(5))
    assert torch.equal(index_range(5, like, torch.float32), torch.arange(5, dtype=torch.float32))
    assert index_range(0, like).shape == (0,)


def test_a_traced_index_range_follows_the_size_and_records_no_device():
    class Positions(torch.nn.Module):
        def forward(self, x):
            return index_range(x.shape[1], x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(Positions(), torch.zeros(2, 4))
    assert torch.equal(traced(torch.zeros(1, 9)), torch.arange(9))
    assert all(
        value.type().kind() != "DeviceObjType" for node in traced.graph.nodes() for value in node.inputs()
    )


def _trace(function, *inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(function, inputs, check_trace=False)


def test_kept_first_is_a_stable_sort_of_the_dropped_flag():
    keep = torch.rand(5, 37, generator=torch.Generator().manual_seed(0)) > 0.6
    keep[1] = False
    keep[2] = True
    want = torch.argsort((~keep).to(torch.uint8), dim=1, stable=True)
    assert torch.equal(kept_first(keep), want)
    traced = _trace(lambda k: kept_first(k), keep[:, :11])
    assert torch.equal(traced(keep), want)


def test_best_first_breaks_ties_by_index_eager_and_traced():
    values = torch.tensor([[0.5, 0.9, 0.5, 0.1, 0.9, 0.5], [1.0, 1.0, 1.0, 2.0, 0.0, 1.0]])
    want = torch.argsort(values, dim=1, descending=True, stable=True)[:, :4]
    assert torch.equal(best_first(values, 4), want)
    assert not is_graph_capture()
    traced = _trace(lambda v: best_first(v, at_most(v.shape[1], 4)), values[:, :3])
    assert torch.equal(traced(values), want)
    assert torch.equal(
        traced(values[:, :3]), torch.argsort(values[:, :3], dim=1, descending=True, stable=True)
    )


def test_size_of_and_at_most_follow_a_traced_size():
    traced = _trace(lambda x: size_of(x.shape[1], x) + at_most(x.shape[0], 3) * 0, torch.zeros(2, 5))
    assert float(traced(torch.zeros(4, 17))) == 17.0
    assert at_most(7, 3) == 3 and at_most(2, 3) == 2


def test_best_first_in_onnx_breaks_ties_by_index(tmp_path):
    """ONNX has no stable sort: an exported best_first is TopK, whose ties go to the lower index."""
    ort = pytest.importorskip("onnxruntime")

    class Best(torch.nn.Module):
        def forward(self, values):
            return best_first(values, at_most(values.shape[1], 4))

    values = torch.tensor([[0.5, 0.9, 0.5, 0.1, 0.9, 0.5], [1.0, 1.0, 1.0, 2.0, 0.0, 1.0]])
    path = str(tmp_path / "best.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Best(),
            (values[:, :3],),
            path,
            dynamo=False,
            input_names=["v"],
            dynamic_axes={"v": {0: "b", 1: "n"}},
        )
    (got,) = ort.InferenceSession(path).run(None, {"v": values.numpy()})
    assert got.tolist() == torch.argsort(values, dim=1, descending=True, stable=True)[:, :4].tolist()
