"""MobileNetV3 for text recognition (PaddleOCR ``rec_mobilenet_v3`` semantics).

Height is reduced 32x and width 4x: stride-2 stem, height-only ``(s, 1)`` strides in the
blocks, then a 2x2 max-pool. A 3x32xW image becomes a (C, 1, W/4) feature map.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ppdist.modeling.freezing import FreezableBackbone
from ppdist.modeling.layers import ConvBNLayer, ResidualUnit, make_divisible
from ppdist.registry import BACKBONES

SUPPORTED_SCALES = (0.35, 0.5, 0.75, 1.0, 1.25)
STEM_CHANNELS = 16


class BlockSpec(NamedTuple):
    """One inverted-residual block at scale 1.0."""

    kernel: int
    expand: int
    out: int
    use_se: bool
    act: str
    stride: Union[int, Tuple[int, int]]


def _large_blocks(strides: Sequence[int]) -> List[BlockSpec]:
    s0, s1, s2, s3 = strides
    return [
        BlockSpec(3, 16, 16, False, "relu", s0),
        BlockSpec(3, 64, 24, False, "relu", (s1, 1)),
        BlockSpec(3, 72, 24, False, "relu", 1),
        BlockSpec(5, 72, 40, True, "relu", (s2, 1)),
        BlockSpec(5, 120, 40, True, "relu", 1),
        BlockSpec(5, 120, 40, True, "relu", 1),
        BlockSpec(3, 240, 80, False, "hardswish", 1),
        BlockSpec(3, 200, 80, False, "hardswish", 1),
        BlockSpec(3, 184, 80, False, "hardswish", 1),
        BlockSpec(3, 184, 80, False, "hardswish", 1),
        BlockSpec(3, 480, 112, True, "hardswish", 1),
        BlockSpec(3, 672, 112, True, "hardswish", 1),
        BlockSpec(5, 672, 160, True, "hardswish", (s3, 1)),
        BlockSpec(5, 960, 160, True, "hardswish", 1),
        BlockSpec(5, 960, 160, True, "hardswish", 1),
    ]


def _small_blocks(strides: Sequence[int]) -> List[BlockSpec]:
    s0, s1, s2, s3 = strides
    return [
        BlockSpec(3, 16, 16, True, "relu", (s0, 1)),
        BlockSpec(3, 72, 24, False, "relu", (s1, 1)),
        BlockSpec(3, 88, 24, False, "relu", 1),
        BlockSpec(5, 96, 40, True, "hardswish", (s2, 1)),
        BlockSpec(5, 240, 40, True, "hardswish", 1),
        BlockSpec(5, 240, 40, True, "hardswish", 1),
        BlockSpec(5, 120, 48, True, "hardswish", 1),
        BlockSpec(5, 144, 48, True, "hardswish", 1),
        BlockSpec(5, 288, 96, True, "hardswish", (s3, 1)),
        BlockSpec(5, 576, 96, True, "hardswish", 1),
        BlockSpec(5, 576, 96, True, "hardswish", 1),
    ]


# the blocks that take large_stride / small_stride[i]: each starts a stage (for frozen stages)
STAGE_STARTS = {"large": (0, 1, 3, 12), "small": (0, 1, 3, 8)}
# model_name -> (block table builder, squeeze channels at scale 1.0, default strides)
VARIANTS = {
    "large": (_large_blocks, 960, [1, 2, 2, 2]),
    "small": (_small_blocks, 576, [2, 2, 2, 2]),
}


def _check_strides(name: str, strides: Optional[Sequence[int]], default: List[int]) -> List[int]:
    if strides is None:
        return list(default)
    if (
        not isinstance(strides, (list, tuple))
        or len(strides) != 4
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in strides)
    ):
        raise ValueError(f"MobileNetV3.{name} must be a list of 4 positive ints, got {strides!r}")
    return list(strides)


@BACKBONES.register(name="MobileNetV3")
class MobileNetV3(FreezableBackbone):
    """Recognition MobileNetV3: (B, C_in, H, W) -> (B, out_channels, H/32, W/4).

    Units for ``freeze_at`` / ``frozen_stages`` / ``freeze_norm`` (``ppdist.modeling.freezing``):
    the stem (``conv1``), then 4 stages, each starting at a block that takes one of the 4
    ``large_stride`` / ``small_stride`` entries; the last holds ``conv2``."""

    def __init__(
        self,
        in_channels: int = 3,
        model_name: str = "small",
        scale: float = 0.5,
        large_stride: Optional[List[int]] = None,
        small_stride: Optional[List[int]] = None,
        disable_se: bool = False,
        freeze_at: Optional[int] = None,
        frozen_stages: Optional[int] = None,
        freeze_norm: bool = False,
    ) -> None:
        super().__init__()
        if model_name not in VARIANTS:
            raise ValueError(f"MobileNetV3.model_name must be one of {sorted(VARIANTS)}, got {model_name!r}")
        if scale not in SUPPORTED_SCALES:
            raise ValueError(f"MobileNetV3.scale must be one of {SUPPORTED_SCALES}, got {scale!r}")
        large_stride = _check_strides("large_stride", large_stride, VARIANTS["large"][2])
        small_stride = _check_strides("small_stride", small_stride, VARIANTS["small"][2])

        build_table, squeeze, _ = VARIANTS[model_name]
        table = build_table(large_stride if model_name == "large" else small_stride)

        channels = make_divisible(STEM_CHANNELS * scale)
        self.conv1 = ConvBNLayer(in_channels, channels, 3, stride=2, padding=1, act="hardswish")
        blocks = []
        for spec in table:
            out = make_divisible(spec.out * scale)
            blocks.append(
                ResidualUnit(
                    channels,
                    make_divisible(spec.expand * scale),
                    out,
                    spec.kernel,
                    spec.stride,
                    spec.use_se and not disable_se,
                    act=spec.act,
                )
            )
            channels = out
        self.blocks = nn.Sequential(*blocks)
        self.out_channels = make_divisible(squeeze * scale)
        self.conv2 = ConvBNLayer(channels, self.out_channels, 1, act="hardswish")
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2, padding=0)
        starts = (*STAGE_STARTS[model_name], len(blocks))
        stages = [list(self.blocks[a:b]) for a, b in zip(starts, starts[1:])]
        stages[-1].append(self.conv2)
        self.freeze([[self.conv1], *stages], freeze_at, frozen_stages, freeze_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv2(self.blocks(self.conv1(x)))
        if x.shape[2] < 2 or x.shape[3] < 2:
            raise ValueError(
                f"MobileNetV3: feature map {tuple(x.shape[2:])} is too small for the final 2x2 "
                "max-pool; use a taller/wider input or fewer height strides "
                "(e.g. small_stride: [1, 2, 2, 2] for 32-pixel-high images)"
            )
        return self.pool(x)
