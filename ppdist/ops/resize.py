"""Segmentation logits resized to the label's size: upcast to float32 first, then a bilinear upsample
whose backward has no atomic scatter (two interpolation-matrix GEMMs), then the loss.

``F.interpolate``'s bilinear backward on CUDA scatters every output pixel's gradient into its 4
input cells with ``atomicAdd``: upsampling 8x-32x to 1024x512, 64 to 1,024 output pixels contend
for each input cell. Bilinear interpolation is separable and linear, so the same values are
``A_h @ x @ A_w^T`` with fixed (out x in) matrices holding PyTorch's weights, whose backward
``A_h^T @ g @ A_w`` is two GEMMs as well.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Sequence, Tuple

import torch
import torch.nn.functional as F

# The dense GEMMs do about in * (in' + out) / out multiply-adds per output value where the direct
# kernel does 4: past these bounds F.interpolate is kept. On the CPU, whose bilinear backward has no
# atomics, they pay up to ~100 (PP-LiteSeg's 1/8 head at 1024x512: 80; OCRNet's 1/4 logits: 192 and
# SegFormer's at 1024x1024: 320 are 1.6x and 2.5x slower there, docs/benchmarks.md); on CUDA they
# replace an atomicAdd scatter of 16 to 1,024 output pixels per input cell (bound not yet measured).
MAX_MACS_PER_OUTPUT = {"cpu": 128, "cuda": 512}


def interpolation_matrix(
    in_size: int, out_size: int, align_corners: bool, device: torch.device, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(out_size, in_size) matrix of 1-D linear interpolation with PyTorch's arithmetic
    (``area_pixel_compute_source_index`` in ``dtype``, the upper neighbour clamped to the edge)."""
    dst = torch.arange(out_size, dtype=dtype, device=device)
    if align_corners:
        src = dst * ((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0)
    else:
        src = ((dst + 0.5) * (in_size / out_size) - 0.5).clamp(min=0.0)
    low = src.long().clamp(max=in_size - 1)
    high = torch.where(low < in_size - 1, low + 1, low)
    frac = (src - low.to(dtype)).unsqueeze(1)
    columns = torch.arange(in_size, device=device)
    return (columns == low.unsqueeze(1)) * (1.0 - frac) + (columns == high.unsqueeze(1)) * frac


_cached_matrix = functools.lru_cache(maxsize=64)(interpolation_matrix)


def _matrix(in_size: int, out_size: int, align_corners: bool, like: torch.Tensor) -> torch.Tensor:
    """The matrix for ``like``'s device and dtype: built once per shape in eager mode, traced into
    a compiled graph (which has no cache to consult)."""
    build = interpolation_matrix if torch.compiler.is_compiling() else _cached_matrix
    return build(in_size, out_size, align_corners, like.device, like.dtype)


@contextlib.contextmanager
def _ieee_matmul(tensor: torch.Tensor) -> Iterator[None]:
    """Full float32 GEMMs on CUDA whatever ``Global.float32_matmul_precision`` says (TF32 would
    round the logits to 10 mantissa bits); a compiled graph follows the global setting."""
    if torch.compiler.is_compiling() or tensor.device.type != "cuda":
        yield
        return
    previous = torch.get_float32_matmul_precision()
    if previous == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _width_first(in_hw: Sequence[int], out_hw: Sequence[int]) -> bool:
    """Whether resizing along W before H does fewer multiply-adds."""
    (hi, wi), (ho, wo) = in_hw, out_hw
    return hi * wo * (wi + ho) <= ho * wi * (hi + wo)


def _along_w(x: torch.Tensor, a_w: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, C, H, W'): ``x @ a_w^T``, one GEMM over all rows."""
    n, c, h, w = x.shape
    return x.reshape(n * c * h, w).mm(a_w.t()).view(n, c, h, a_w.shape[0])


def _along_h(x: torch.Tensor, a_h: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, C, H', W): ``a_h @ x`` per (image, channel), one batched GEMM."""
    n, c, h, w = x.shape
    return torch.bmm(a_h.expand(n * c, *a_h.shape), x.reshape(n * c, h, w)).view(n, c, a_h.shape[0], w)


def _along_w_nhwc(x: torch.Tensor, a_w: torch.Tensor) -> torch.Tensor:
    """``_along_w`` of a channels_last tensor, in its layout (no copy): ``a_w @ x[n, h]`` (W, C)."""
    n, c, h, w = x.shape
    rows = x.permute(0, 2, 3, 1).reshape(n * h, w, c)
    out = torch.bmm(a_w.expand(n * h, *a_w.shape), rows)
    return out.view(n, h, a_w.shape[0], c).permute(0, 3, 1, 2)


def _along_h_nhwc(x: torch.Tensor, a_h: torch.Tensor) -> torch.Tensor:
    """``_along_h`` of a channels_last tensor, in its layout (no copy): ``a_h @ x[n]`` (H, W * C)."""
    n, c, h, w = x.shape
    planes = x.permute(0, 2, 3, 1).reshape(n, h, w * c)
    out = torch.bmm(a_h.expand(n, *a_h.shape), planes)
    return out.view(n, a_h.shape[0], w, c).permute(0, 3, 1, 2)


def _separable(x: torch.Tensor, a_h: torch.Tensor, a_w: torch.Tensor) -> torch.Tensor:
    """``a_h @ x @ a_w^T`` over the last two dimensions of (N, C, H, W) ``x``, the cheaper axis
    first: two GEMM launches, in ``x``'s layout (NCHW or channels_last)."""
    nhwc = not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
    along_w, along_h = (_along_w_nhwc, _along_h_nhwc) if nhwc else (_along_w, _along_h)
    with _ieee_matmul(x):
        if _width_first(x.shape[-2:], (a_h.shape[0], a_w.shape[0])):
            return along_h(along_w(x, a_w), a_h)
        return along_w(along_h(x, a_h), a_w)


class _SeparableBilinear(torch.autograd.Function):
    """Bilinear resize as two GEMMs, forward and backward (a custom Function so that the backward's
    GEMMs run in full float32 too)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, a_h: torch.Tensor, a_w: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(a_h, a_w)
        return _separable(x, a_h, a_w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None]:  # type: ignore[override]
        a_h, a_w = ctx.saved_tensors
        return _separable(grad, a_h.t(), a_w.t()), None, None


def separable_bilinear(x: torch.Tensor, size: Sequence[int], align_corners: bool) -> torch.Tensor:
    """``F.interpolate(x, size, mode="bilinear", align_corners=align_corners)`` of a float32 (or
    float64) (N, C, H, W) tensor as interpolation-matrix GEMMs (atomic-free backward)."""
    (hi, wi), (ho, wo) = x.shape[-2:], size
    a_h = _matrix(hi, ho, align_corners, x)
    a_w = _matrix(wi, wo, align_corners, x)
    return _SeparableBilinear.apply(x, a_h, a_w)


def gemm_resize_usable(in_hw: Sequence[int], out_hw: Sequence[int], device_type: str = "cuda") -> bool:
    """Whether the GEMM form pays: an upsample (no axis shrinks) whose dense matrices cost at most
    ``MAX_MACS_PER_OUTPUT[device_type]`` multiply-adds per output value."""
    (hi, wi), (ho, wo) = in_hw, out_hw
    if ho < hi or wo < wi:
        return False
    macs = min(hi * wo * (wi + ho), ho * wi * (hi + wo))
    return macs <= MAX_MACS_PER_OUTPUT.get(device_type, MAX_MACS_PER_OUTPUT["cpu"]) * ho * wo


@contextlib.contextmanager
def _autocast_off(device_type: str) -> Iterator[None]:
    if torch.is_autocast_enabled(device_type):
        with torch.autocast(device_type, enabled=False):
            yield
    else:
        yield


def _backward_recorded(x: torch.Tensor) -> bool:
    """Whether autograd records ``x``'s graph for a backward, outside an export's trace (a traced
    graph keeps the size-generic F.interpolate)."""
    if torch.jit.is_tracing() or torch.compiler.is_exporting():
        return False
    return torch.is_grad_enabled() and x.requires_grad


def upsample_logits(logits: torch.Tensor, size: Sequence[int], align_corners: bool = False) -> torch.Tensor:
    """A head's (N, C, h, w) logits bilinearly resized to ``size`` in float32 (float64 stays), for
    the loss and the post-process: upcast first (under autocast the low-resolution logits, not the
    full-resolution ones), then resize with autocast off. While autograd records (training) an
    upsample the GEMMs can afford (``gemm_resize_usable``) runs as ``separable_bilinear``;
    otherwise (evaluation, inference, export and tracing, a shrinking axis, very large inputs)
    ``F.interpolate``."""
    with _autocast_off(logits.device.type):
        x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        if _backward_recorded(x):
            out_hw = (int(size[0]), int(size[1]))
            if tuple(x.shape[-2:]) == out_hw:
                return x
            if gemm_resize_usable(x.shape[-2:], out_hw, x.device.type):
                return separable_bilinear(x, out_hw, align_corners)
        # a traced size stays traced (an exported graph resizes to its input's size)
        return F.interpolate(x, list(size), mode="bilinear", align_corners=align_corners)
