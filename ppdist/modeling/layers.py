"""Small building blocks shared by the backbones (MobileNetV3 family, PaddleOCR semantics)."""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ppdist.ops.ranges import Length, index_range

Stride = Union[int, Tuple[int, int]]

SUPPORTED_ACTIVATIONS = (None, "relu", "hardswish")


def make_divisible(value: float, divisor: int = 8, min_value: Optional[int] = None) -> int:
    """Round ``value`` to the nearest multiple of ``divisor`` (at least ``min_value``).

    If rounding would lose more than 10% of ``value``, one more ``divisor`` is added.
    """
    floor = divisor if min_value is None else min_value
    rounded = max(floor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


def hard_sigmoid_paddle(x: torch.Tensor, slope: float = 0.2, offset: float = 0.5) -> torch.Tensor:
    """Paddle's ``hardsigmoid``: ``clamp(slope * x + offset, 0, 1)``.

    PyTorch's ``nn.Hardsigmoid`` uses slope 1/6; PaddleOCR's SE gates use 0.2.
    """
    return torch.clamp(x * slope + offset, min=0.0, max=1.0)


def make_activation(act: Optional[str]) -> nn.Module:
    """The activation module for ``act`` (None means identity)."""
    if act is None:
        return nn.Identity()
    if act == "relu":
        return nn.ReLU()
    if act == "hardswish":
        return nn.Hardswish()
    raise ValueError(f"unsupported activation {act!r}; expected one of {SUPPORTED_ACTIVATIONS}")


class ConvBNLayer(nn.Module):
    """Bias-free Conv2d -> BatchNorm2d -> optional activation."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: Stride = 1,
        padding: int = 0,
        groups: int = 1,
        act: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, groups=groups, bias=False
        )
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
        self.act = make_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class SEModule(nn.Module):
    """Squeeze-and-excitation: global average pool, C -> C/r -> C, Paddle hard-sigmoid gate."""

    def __init__(self, channels: int, reduction: int = 4, slope: float = 0.2, offset: float = 0.5) -> None:
        super().__init__()
        squeezed = channels // reduction
        if squeezed < 1:
            raise ValueError(f"SEModule: {channels} channels cannot be reduced by {reduction}")
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.conv1 = nn.Conv2d(channels, squeezed, kernel_size=1, bias=True)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(squeezed, channels, kernel_size=1, bias=True)
        self.slope = slope
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.conv2(self.relu(self.conv1(self.avg_pool(x))))
        return x * hard_sigmoid_paddle(gate, self.slope, self.offset)


class ResidualUnit(nn.Module):
    """MobileNetV3 inverted residual: 1x1 expand -> kxk depthwise -> [SE] -> 1x1 project.

    The identity shortcut is used only when ``stride == 1`` (the integer; a tuple such as
    ``(1, 1)`` does not count, as in PaddleOCR) and the channel count is unchanged.
    """

    def __init__(
        self,
        in_channels: int,
        mid_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: Stride,
        use_se: bool,
        act: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.use_shortcut = (
            not isinstance(stride, (tuple, list)) and stride == 1 and in_channels == out_channels
        )
        self.use_se = use_se
        self.expand_conv = ConvBNLayer(in_channels, mid_channels, 1, act=act)
        self.bottleneck_conv = ConvBNLayer(
            mid_channels,
            mid_channels,
            kernel_size,
            stride=tuple(stride) if isinstance(stride, list) else stride,
            padding=(kernel_size - 1) // 2,
            groups=mid_channels,
            act=act,
        )
        self.mid_se = SEModule(mid_channels) if use_se else nn.Identity()
        self.linear_conv = ConvBNLayer(mid_channels, out_channels, 1, act=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear_conv(self.mid_se(self.bottleneck_conv(self.expand_conv(x))))
        return x + y if self.use_shortcut else y


def init_linear_uniform(linear: nn.Linear) -> None:
    """Uniform(+-1/sqrt(fan_in)) initialisation of a Linear's weight and bias (Paddle's choice)."""
    bound = 1.0 / math.sqrt(linear.in_features)
    nn.init.uniform_(linear.weight, -bound, bound)
    if linear.bias is not None:
        nn.init.uniform_(linear.bias, -bound, bound)


class L2TaggedModule(nn.Module):
    """A module whose parameters carry ``param.regularizer_factor`` (Paddle's per-parameter L2).

    The optimizer builder reads that attribute. ``torch.nn.Parameter.__deepcopy__`` drops
    Python attributes, so they are re-applied after ``copy.deepcopy`` / unpickling.
    Subclasses set ``self.regularizer_factor`` and call ``self.tag_parameters()``.
    """

    regularizer_factor: float = 0.0

    def tag_parameters(self) -> None:
        for param in self.parameters():
            param.regularizer_factor = float(self.regularizer_factor)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.tag_parameters()


class ConvBNAct(nn.Module):
    """Conv2d ('same' padding for odd kernels) -> BatchNorm2d -> optional activation.

    Unlike ``ConvBNLayer`` the convolution may carry a bias (PaddleSeg's ``ConvBNReLU``
    keeps Paddle's default bias unless told otherwise).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        groups: int = 1,
        bias: bool = False,
        act: Optional[str] = "relu",
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=kernel_size // 2,
            groups=groups,
            bias=bias,
        )
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
        self.act = nn.LeakyReLU(0.01) if act == "leakyrelu" else make_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


def init_paddle_conv_default(module: nn.Module) -> None:
    """Paddle's default ``nn.Conv2D`` init on every conv in ``module``: weights from
    Normal(0, sqrt(2 / (k*k*C_in/groups))), biases 0; BatchNorm weight 1, bias 0."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            fan_in = m.weight[0].numel()
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_in))
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def tag_norm_no_decay(module: nn.Module) -> None:
    """Set ``regularizer_factor = 0.0`` on every norm layer's weight and bias in ``module``.

    PaddleDetection exempts BatchNorm scale/shift from L2 decay; ppdist's optimizer builder
    reads ``param.regularizer_factor``. Other parameters are left untouched.
    """
    for m in module.modules():
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)):
            for param in (m.weight, m.bias):
                if param is not None:
                    param.regularizer_factor = 0.0


class NormNoDecayModule(nn.Module):
    """A module whose norm parameters are tagged by ``tag_norm_no_decay``.

    Subclasses call ``tag_norm_no_decay(self)`` at the end of ``__init__``; the tags are
    re-applied after ``copy.deepcopy`` / unpickling, which drop parameter attributes.
    """

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        tag_norm_no_decay(self)


def _pooling_matrix(length: Length, bins: int, like: torch.Tensor) -> torch.Tensor:
    """[bins, length] averaging weights of adaptive pooling along one axis: bin i covers
    ``[floor(i * L / bins), ceil((i + 1) * L / bins))``, as ``F.adaptive_avg_pool2d``. The ranges
    are made from ``like`` (``index_range``), so a traced graph records no device."""
    index = index_range(bins, like).unsqueeze(1)
    start = torch.div(index * length, bins, rounding_mode="floor")
    end = torch.div((index + 1) * length + bins - 1, bins, rounding_mode="floor")
    position = index_range(length, like).unsqueeze(0)
    inside = ((position >= start) & (position < end)).to(like.dtype)
    return inside / (end - start).to(like.dtype)


class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` that, while being exported or traced, pools with two averaging
    matrices built from the input's symbolic size, so the exported graph is exact for any input
    size (ONNX has no adaptive pooling; exporters assume sizes divisible by the bins)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()):
            return super().forward(x)
        bins_h, bins_w = (
            (self.output_size, self.output_size) if isinstance(self.output_size, int) else self.output_size
        )
        rows = _pooling_matrix(x.shape[2], int(bins_h), x)  # a traced size is a 0-d tensor
        cols = _pooling_matrix(x.shape[3], int(bins_w), x)
        return torch.matmul(torch.matmul(rows, x), cols.transpose(0, 1))


def at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in fp32 when it is in a half precision (autocast's fp16/bf16); fp32 and fp64 as they are."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


class DropPath(nn.Module):
    """Stochastic depth per sample (training only): keep with 1 - p, scaled by 1 / (1 - p)."""

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = torch.floor(
            keep + torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), dtype=x.dtype, device=x.device)
        )
        return x / keep * mask
