"""PP-LCNet for table recognition and detection (PaddleOCR's ``det_pp_lcnet`` ``PPLCNet``).

A hardswish stem (stride 2) and five stages of depthwise-separable blocks (depthwise kxk conv ->
optional squeeze-and-excitation -> pointwise 1x1 conv, each conv + BatchNorm + hardswish); the
backbone returns the outputs of stages 3 to 6 (strides 4, 8, 16, 32), as a list.

Attribute names are PaddleOCR's (``conv1``, ``blocks2`` ... ``blocks6``, ``dw_conv``, ``se``,
``pw_conv``, ``conv``, ``bn``), so state-dict keys are Paddle's. ``pretrained`` / ``use_ssld`` are
accepted for PaddleOCR's configs; ppdist downloads nothing: backbone weights come from a local file
named by the stage's ``pretrained`` key, loaded by the trainer.
"""

from __future__ import annotations

from typing import List, NamedTuple, Union

import torch
from torch import nn

from ppdist.modeling.layers import (
    NormNoDecayModule,
    hard_sigmoid_paddle,
    init_paddle_conv_default,
    make_divisible,
    tag_norm_no_decay,
)
from ppdist.registry import BACKBONES

# paddle.nn.Hardsigmoid's default slope 0.1666667, as Paddle's float32 op attribute holds it (the
# float64 0.1666667 moves the fixture's float64 gradients by 9e-7 of their size; torch's is 1/6)
PADDLE_HARDSIGMOID_SLOPE = 0.16666670143604279
STEM_CHANNELS = 16
STAGES = ("blocks2", "blocks3", "blocks4", "blocks5", "blocks6")
OUTPUT_STAGES = ("blocks3", "blocks4", "blocks5", "blocks6")


class Block(NamedTuple):
    """One depthwise-separable block at scale 1.0."""

    kernel: int
    in_channels: int
    out_channels: int
    stride: int
    use_se: bool


NET_CONFIG = {
    "blocks2": [Block(3, 16, 32, 1, False)],
    "blocks3": [Block(3, 32, 64, 2, False), Block(3, 64, 64, 1, False)],
    "blocks4": [Block(3, 64, 128, 2, False), Block(3, 128, 128, 1, False)],
    "blocks5": [Block(3, 128, 256, 2, False)] + [Block(5, 256, 256, 1, False)] * 5,
    "blocks6": [Block(5, 256, 512, 2, True), Block(5, 512, 512, 1, True)],
}


class ConvBNLayer(nn.Module):
    """Bias-free conv ('same' padding) -> BatchNorm -> hardswish."""

    def __init__(
        self, in_channels: int, kernel_size: int, out_channels: int, stride: int, groups: int = 1
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=(kernel_size - 1) // 2,
            groups=groups,
            bias=False,
        )
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
        self.hardswish = nn.Hardswish()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hardswish(self.bn(self.conv(x)))


class SEModule(nn.Module):
    """Squeeze-and-excitation with Paddle's ``nn.Hardsigmoid`` gate (slope 0.1666667, offset 0.5)."""

    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.conv1 = nn.Conv2d(channels, channels // reduction, kernel_size=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(channels // reduction, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.conv2(self.relu(self.conv1(self.avg_pool(x))))
        return x * hard_sigmoid_paddle(gate, PADDLE_HARDSIGMOID_SLOPE, 0.5)


class DepthwiseSeparable(nn.Module):
    """Depthwise kxk ConvBNLayer -> [SE] -> pointwise 1x1 ConvBNLayer."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, dw_size: int, use_se: bool) -> None:
        super().__init__()
        self.use_se = use_se
        self.dw_conv = ConvBNLayer(in_channels, dw_size, in_channels, stride, groups=in_channels)
        if use_se:
            self.se = SEModule(in_channels)
        self.pw_conv = ConvBNLayer(in_channels, 1, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dw_conv(x)
        if self.use_se:
            x = self.se(x)
        return self.pw_conv(x)


def _check_scale(scale: Union[int, float]) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
        raise ValueError(f"PPLCNet.scale must be a positive number (e.g. 1.0), got {scale!r}")
    return float(scale)


@BACKBONES.register(name="PPLCNet")
class PPLCNet(NormNoDecayModule):
    """(B, in_channels, H, W) -> [stage 3 (H/4), stage 4 (H/8), stage 5 (H/16), stage 6 (H/32)].

    BatchNorm scales and shifts carry ``regularizer_factor = 0`` (the original's ``L2Decay(0.0)``).

    ``out_channels`` lists the four levels' channels: ``int(c * scale)`` for c = 64, 128, 256, 512,
    as PaddleOCR declares them (the layers round with ``make_divisible``; equal at the usual scales).
    """

    def __init__(
        self, in_channels: int = 3, scale: float = 1.0, pretrained: bool = False, use_ssld: bool = False
    ) -> None:
        super().__init__()
        scale = _check_scale(scale)
        self.scale = scale
        self.out_channels: List[int] = [
            int(NET_CONFIG[name][-1].out_channels * scale) for name in OUTPUT_STAGES
        ]
        self.conv1 = ConvBNLayer(in_channels, 3, make_divisible(STEM_CHANNELS * scale), 2)
        for name in STAGES:
            blocks = [
                DepthwiseSeparable(
                    make_divisible(block.in_channels * scale),
                    make_divisible(block.out_channels * scale),
                    block.stride,
                    block.kernel,
                    block.use_se,
                )
                for block in NET_CONFIG[name]
            ]
            self.add_module(name, nn.Sequential(*blocks))
        init_paddle_conv_default(self)
        tag_norm_no_decay(self)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        x = self.blocks2(self.conv1(x))
        outs = []
        for name in OUTPUT_STAGES:
            x = getattr(self, name)(x)
            outs.append(x)
        return outs
