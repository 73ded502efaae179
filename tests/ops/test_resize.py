"""upsample_logits: float32 first, then a GEMM upsample equal to F.interpolate's bilinear forward and
backward; F.interpolate where no backward runs or the GEMMs would not pay."""

from typing import List

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ppdist.benchmark.op_count import launches
from ppdist.ops.resize import (
    gemm_resize_usable,
    interpolation_matrix,
    separable_bilinear,
    upsample_logits,
)
from ppdist.utils.host_sync import HostSyncCounter

SIZES = [  # (in h, in w) -> (out h, out w): integer factors, odd sizes, non-integer factors, one row
    ((4, 8), (32, 64)),
    ((16, 32), (512, 1024)),
    ((5, 7), (40, 56)),
    ((7, 5), (13, 11)),
    ((3, 9), (10, 9)),
    ((1, 6), (1, 24)),
    ((9, 1), (27, 3)),
]


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("in_hw, out_hw", SIZES)
def test_separable_bilinear_equals_interpolate_forward_and_backward(in_hw, out_hw, align_corners, layout):
    generator = torch.Generator().manual_seed(sum(in_hw + out_hw))
    x = (torch.randn(2, 3, *in_hw, generator=generator) * 10).to(memory_format=layout).requires_grad_()
    grad = torch.randn(2, 3, *out_hw, generator=generator).to(memory_format=layout)
    ref = F.interpolate(x, out_hw, mode="bilinear", align_corners=align_corners)
    (ref_grad,) = torch.autograd.grad(ref, x, grad)
    out = separable_bilinear(x, out_hw, align_corners)
    (out_grad,) = torch.autograd.grad(out, x, grad)
    assert out.shape == ref.shape and out.dtype == torch.float32
    # float32 rounding: a few ulps of the largest value forward (sums of 2 x 2 products); the
    # backward sums up to (2 * 32)^2 products per input cell (measured: <= 3e-6 relative)
    eps = torch.finfo(torch.float32).eps
    torch.testing.assert_close(out, ref, rtol=0, atol=4 * eps * float(ref.detach().abs().max()))
    torch.testing.assert_close(out_grad, ref_grad, rtol=0, atol=1e-5 * float(ref_grad.abs().max()))


def test_separable_bilinear_in_float64_stays_float64():
    x = torch.randn(1, 2, 5, 6, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(1, 2, 40, 24, dtype=torch.float64)
    ref = F.interpolate(x, (40, 24), mode="bilinear", align_corners=False)
    out = upsample_logits(x, (40, 24))
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-13)
    grads = [torch.autograd.grad(y, x, grad)[0] for y in (out, ref)]
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("align_corners", [False, True])
def test_interpolation_matrix_rows_interpolate_a_ramp(align_corners):
    # bilinear interpolation of a linear ramp is the ramp at the source coordinate
    matrix = interpolation_matrix(6, 48, align_corners, torch.device("cpu"))
    assert matrix.shape == (48, 6)
    torch.testing.assert_close(matrix.sum(1), torch.ones(48))
    ramp = torch.arange(6, dtype=torch.float32)
    expected = F.interpolate(ramp.reshape(1, 1, 6), 48, mode="linear", align_corners=align_corners)
    torch.testing.assert_close(matrix @ ramp, expected.reshape(48))


def test_upsample_logits_upcasts_before_resizing_under_autocast():
    generator = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(4, 5, 1)
    x = torch.randn(2, 4, 8, 16, generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = conv(x)
        assert low.dtype == torch.bfloat16
        out = upsample_logits(low, (64, 128))
    assert out.dtype == torch.float32
    expected = F.interpolate(low.detach().float(), (64, 128), mode="bilinear", align_corners=False)
    torch.testing.assert_close(out.detach(), expected, rtol=0, atol=1e-5)
    # the bf16 upsample of today rounds every full-resolution value to 8 mantissa bits
    today = F.interpolate(low.detach(), (64, 128), mode="bilinear", align_corners=False).float()
    assert (today - expected).abs().max() > 1e-3
    out.sum().backward()
    assert conv.weight.grad is not None


def test_upsample_logits_takes_gemms_only_when_a_backward_runs():
    x = torch.randn(1, 2, 4, 4, requires_grad=True)
    assert type(upsample_logits(x, (16, 16)).grad_fn).__name__ == "_SeparableBilinearBackward"
    assert upsample_logits(x, (4, 4)) is x  # nothing to resize
    shrunk = upsample_logits(x, (2, 8))  # an axis shrinks: F.interpolate
    assert type(shrunk.grad_fn).__name__ == "UpsampleBilinear2DBackward0"
    with torch.no_grad():  # evaluation, inference, export: F.interpolate, bit for bit
        out = upsample_logits(x, (16, 16), align_corners=True)
        assert torch.equal(out, F.interpolate(x, (16, 16), mode="bilinear", align_corners=True))


class _Launches(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches(func):
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_the_gemm_upsample_is_two_launches_each_way_in_either_layout(layout):
    x = torch.randn(2, 5, 8, 16).to(memory_format=layout).requires_grad_()
    upsample_logits(x, (64, 128))  # the matrices are built once per shape
    with _Launches() as forward:
        out = upsample_logits(x, (64, 128))
    grad = torch.ones_like(out)
    with _Launches() as backward:
        out.backward(grad)
    assert sorted(forward.names) == sorted(backward.names) == ["bmm", "mm"] or (
        layout == torch.channels_last and forward.names == backward.names == ["bmm", "bmm"]
    ), (forward.names, backward.names)


def test_gemm_resize_usable_bounds():
    for device in ("cpu", "cuda"):  # PP-LiteSeg's 1/8, 1/16, 1/32 heads at 1024x512
        assert all(gemm_resize_usable((512 // s, 1024 // s), (512, 1024), device) for s in (8, 16, 32))
        assert not gemm_resize_usable((16, 16), (8, 32), device)  # shrinks an axis
        assert not gemm_resize_usable((512, 512), (2048, 2048), device)
    # OCRNet's 1/4 logits at 1024x512 and SegFormer's at 1024x1024: GEMMs on CUDA only
    for in_hw, out_hw in (((128, 256), (512, 1024)), ((256, 256), (1024, 1024))):
        assert gemm_resize_usable(in_hw, out_hw, "cuda") and not gemm_resize_usable(in_hw, out_hw, "cpu")


def test_upsample_logits_reads_no_device_value():
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with HostSyncCounter() as counter:
        upsample_logits(x, (32, 32)).sum().backward()
    assert counter.count == 0, counter.report()


class _Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 1)  # parameters that require grad, as at export

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return upsample_logits(self.conv(image[:, :, ::4, ::4]), image.shape[-2:])


def test_a_traced_upsample_keeps_f_interpolate_and_the_input_size():
    head = _Head()
    traced = torch.jit.trace(head, torch.randn(1, 3, 32, 48))
    other = torch.randn(1, 3, 64, 40)
    with torch.no_grad():
        expected = F.interpolate(head.conv(other[:, :, ::4, ::4]), (64, 40), mode="bilinear")
        torch.testing.assert_close(traced(other), expected, rtol=0, atol=0)


def test_upsample_logits_compiles_into_one_graph_with_the_same_values():
    head = _Head()
    image = torch.randn(2, 3, 32, 48)
    compiled = torch.compile(head, backend="eager", fullgraph=True)  # a graph break raises
    out, expected = compiled(image), head(image)
    assert type(expected.grad_fn).__name__ == "_SeparableBilinearBackward"
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    grads = [torch.autograd.grad(y.square().sum(), head.conv.weight)[0] for y in (out, expected)]
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
