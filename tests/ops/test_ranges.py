"""index_range equals arange, and a traced one follows the input's size without naming a device."""

import warnings

import torch

from ppdist.ops.ranges import index_range


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
