"""MobileNetV1Enhance (PP-LCNet-style) for text recognition, PaddleOCR ``rec_mv1_enhance`` semantics.

A stride-2 stem, thirteen depthwise-separable blocks (height-only ``(2, 1)`` strides at three of
them, 5x5 depthwise kernels and SE gates in the last ones), then a pooling that halves the rest.
With PP-OCRv3's settings (scale 0.5, last_conv_stride [1, 2], 2x2 average pooling) a 3x48x320
line becomes a (512, 1, 40) feature map. Attribute names are PaddleOCR's (``conv1._conv``,
``block_list.N._depthwise_conv._batch_norm``, ``._se.conv1``...), so Paddle weights load by name.
BatchNorm scale/shift carry no L2 decay (``L2Decay(0.0)`` in the original).
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence, Tuple, Union

import torch
from torch import nn

from ppdist.modeling.layers import (
    NormNoDecayModule,
    hard_sigmoid_paddle,
    init_paddle_conv_default,
    tag_norm_no_decay,
)
from ppdist.registry import BACKBONES

Stride = Union[int, Tuple[int, int]]
PADDLE_HARDSIGMOID_SLOPE = 0.1666667  # Paddle's F.hardsigmoid default (the SE gate here)
POOL_TYPES = ("avg", "max")


class ConvBNHardswish(nn.Module):
    """Bias-free Conv2d -> BatchNorm2d (Paddle's eps 1e-5, momentum 0.9) -> hardswish."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: Stride,
        padding: int,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self._conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, groups=groups, bias=False
        )
        self._batch_norm = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
        self.act = nn.Hardswish()
        nn.init.kaiming_normal_(
            self._conv.weight, mode="fan_in", nonlinearity="relu"
        )  # Paddle's KaimingNormal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self._batch_norm(self._conv(x)))


class SEGate(nn.Module):
    """Squeeze-and-excitation, C -> C/4 -> C, gated by Paddle's default hard-sigmoid (slope 1/6)."""

    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.conv1 = nn.Conv2d(channels, channels // reduction, 1)
        self.conv2 = nn.Conv2d(channels // reduction, channels, 1)
        init_paddle_conv_default(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.conv2(torch.relu(self.conv1(self.avg_pool(x))))
        return x * hard_sigmoid_paddle(gate, slope=PADDLE_HARDSIGMOID_SLOPE)


class DepthwiseSeparable(nn.Module):
    """k x k depthwise ConvBN -> [SE] -> 1x1 pointwise ConvBN, both with hardswish."""

    def __init__(
        self,
        in_channels: int,
        mid_channels: int,
        out_channels: int,
        stride: Stride,
        kernel: int,
        use_se: bool,
    ) -> None:
        super().__init__()
        self.use_se = use_se
        self._depthwise_conv = ConvBNHardswish(
            in_channels, mid_channels, kernel, stride, (kernel - 1) // 2, groups=mid_channels
        )
        if use_se:
            self._se = SEGate(mid_channels)
        self._pointwise_conv = ConvBNHardswish(mid_channels, out_channels, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._depthwise_conv(x)
        if self.use_se:
            x = self._se(x)
        return self._pointwise_conv(x)


class BlockSpec(NamedTuple):
    """One block at scale 1.0: depthwise channels, output channels, stride, kernel, SE."""

    mid: int
    out: int
    stride: Stride
    kernel: int = 3
    use_se: bool = False


def _block_table(last_conv_stride: Stride) -> List[BlockSpec]:
    return [
        BlockSpec(32, 64, 1),
        BlockSpec(64, 128, 1),
        BlockSpec(128, 128, 1),
        BlockSpec(128, 256, (2, 1)),
        BlockSpec(256, 256, 1),
        BlockSpec(256, 512, (2, 1)),
        *[BlockSpec(512, 512, 1, 5) for _ in range(5)],
        BlockSpec(512, 1024, (2, 1), 5, True),
        BlockSpec(1024, 1024, last_conv_stride, 5, True),
    ]


def _as_stride(value: Union[int, Sequence[int]], key: str) -> Stride:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        return (int(value[0]), int(value[1]))
    raise ValueError(f"MobileNetV1Enhance.{key} must be a positive int or [height, width], got {value!r}")


@BACKBONES.register(name="MobileNetV1Enhance")
class MobileNetV1Enhance(NormNoDecayModule):
    """(B, 3, H, W) -> (B, int(1024 * scale), H/32, W / (4 * last_conv_stride width)) with the default
    max pooling; ``last_pool_type: avg`` pools with ``last_pool_kernel_size`` (kernel = stride)."""

    def __init__(
        self,
        in_channels: int = 3,
        scale: float = 0.5,
        last_conv_stride: Union[int, List[int]] = 1,
        last_pool_type: str = "max",
        last_pool_kernel_size: Union[int, List[int]] = (3, 2),
    ) -> None:
        super().__init__()
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
            raise ValueError(f"MobileNetV1Enhance.scale must be a positive number, got {scale!r}")
        if last_pool_type not in POOL_TYPES:
            raise ValueError(
                f"MobileNetV1Enhance.last_pool_type must be one of {POOL_TYPES}, got {last_pool_type!r}"
            )
        stride = _as_stride(last_conv_stride, "last_conv_stride")
        pool_kernel = _as_stride(last_pool_kernel_size, "last_pool_kernel_size")
        self.scale = scale

        channels = int(32 * scale)
        self.conv1 = ConvBNHardswish(in_channels, channels, 3, 2, 1)
        blocks = []
        for spec in _block_table(stride):
            mid, out = int(spec.mid * scale), int(spec.out * scale)
            blocks.append(DepthwiseSeparable(channels, mid, out, spec.stride, spec.kernel, spec.use_se))
            channels = out
        self.block_list = nn.Sequential(*blocks)
        if last_pool_type == "avg":
            self.pool: nn.Module = nn.AvgPool2d(pool_kernel, stride=pool_kernel, padding=0)
        else:
            self.pool = nn.MaxPool2d(kernel_size=2, stride=2, padding=0)
        self.out_channels = int(1024 * scale)
        tag_norm_no_decay(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.block_list(self.conv1(x)))
