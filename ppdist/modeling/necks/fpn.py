"""FPN, the Faster R-CNN neck (PaddleDetection semantics and parameter names).

Each backbone map gets a 1x1 lateral conv (``fpn_inner_res{N}_sum_lateral``; the deepest
``fpn_inner_res5_sum``); from the top down each lateral adds the 2x nearest upsampling of the one
above; a 3x3 conv (``fpn_res{N}_sum``) smooths each level. ``extra_stage`` levels follow: without
``has_extra_convs`` one level by subsampling the last output (a 1x1 max pool at stride 2, P6), with
it strided 3x3 convs (``fpn_{N}``) on C5 (``use_c5``) or the last output, ReLU before the next
(``relu_before_extra_convs``). Returns a list of NCHW maps, all ``out_channel`` wide
(P2..P6 at strides 4..64 for ResNet's four maps). Weights: Paddle's XavierUniform (``fan_out`` the
input width for the laterals, ``9 * out_channel`` for the 3x3s), biases 0.
"""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.errors import ConfigError
from ppdist.registry import NECKS


def _xavier_conv(ch_in: int, ch_out: int, kernel: int, stride: int, fan_out: int) -> nn.Conv2d:
    """A biased conv with Paddle's XavierUniform(fan_out): U(-a, a), a = sqrt(6 / (fan_in + fan_out))."""
    conv = nn.Conv2d(ch_in, ch_out, kernel, stride, padding=kernel // 2)
    limit = math.sqrt(6.0 / (ch_in * kernel * kernel + fan_out))
    nn.init.uniform_(conv.weight, -limit, limit)
    nn.init.zeros_(conv.bias)
    return conv


@NECKS.register
class FPN(nn.Module):
    """PaddleDetection's FPN (module docs); ``in_channels``: the backbone's ``out_channels``."""

    @staticmethod
    def check_values(kwargs: Mapping[str, Any], where: str) -> None:
        """Settings ppdist does not build, refused by name before anything runs."""
        if kwargs.get("norm_type") is not None:
            raise ConfigError(
                f"{where}.norm_type {kwargs['norm_type']!r}: ppdist's FPN has plain convolutions (norm_type: null)"
            )
        if not kwargs.get("has_extra_convs", False) and kwargs.get("extra_stage", 1) not in (0, 1):
            raise ConfigError(f"{where}.extra_stage must be 0 or 1 without has_extra_convs")

    def __init__(
        self,
        in_channels: Union[int, Sequence[int]],
        out_channel: int,
        spatial_scales: Sequence[float] = (0.25, 0.125, 0.0625, 0.03125),
        has_extra_convs: bool = False,
        extra_stage: int = 1,
        use_c5: bool = True,
        norm_type: Optional[str] = None,
        norm_decay: float = 0.0,
        freeze_norm: bool = False,
        relu_before_extra_convs: bool = True,
    ) -> None:
        super().__init__()
        self.check_values(
            {"norm_type": norm_type, "has_extra_convs": has_extra_convs, "extra_stage": extra_stage}, "FPN"
        )
        in_channels = [int(in_channels)] if isinstance(in_channels, int) else [int(c) for c in in_channels]
        if not 1 <= len(in_channels) <= 4:
            raise ConfigError(f"FPN.in_channels: 1 to 4 backbone maps (res2..res5), got {in_channels}")
        self.out_channel = int(out_channel)
        scales = [float(s) for s in spatial_scales]
        self.spatial_scales = scales + [scales[-1] / 2.0**i for i in range(1, extra_stage + 1)]
        self.has_extra_convs = has_extra_convs
        self.extra_stage = int(extra_stage)
        self.use_c5 = use_c5
        self.relu_before_extra_convs = relu_before_extra_convs
        self.lateral_names: List[str] = []
        self.fpn_names: List[str] = []
        first = 4 - len(in_channels)
        for i, ch_in in zip(range(first, 4), in_channels):
            lateral = "fpn_inner_res5_sum" if i == 3 else f"fpn_inner_res{i + 2}_sum_lateral"
            self.add_module(lateral, _xavier_conv(ch_in, self.out_channel, 1, 1, ch_in))
            self.lateral_names.append(lateral)
            smooth = f"fpn_res{i + 2}_sum"
            self.add_module(
                smooth, _xavier_conv(self.out_channel, self.out_channel, 3, 1, 9 * self.out_channel)
            )
            self.fpn_names.append(smooth)
        if has_extra_convs:
            for i in range(self.extra_stage):
                ch_in = in_channels[-1] if i == 0 and use_c5 else self.out_channel
                name = f"fpn_{first + len(in_channels) + i + 2}"
                self.add_module(name, _xavier_conv(ch_in, self.out_channel, 3, 2, 9 * self.out_channel))
                self.fpn_names.append(name)
        self.out_channels = self.out_channel
        self.out_strides = [round(1.0 / s) for s in self.spatial_scales]

    def forward(self, feats: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        levels = len(self.lateral_names)
        laterals = [getattr(self, name)(x) for name, x in zip(self.lateral_names, feats)]
        for lvl in range(levels - 1, 0, -1):
            laterals[lvl - 1] = laterals[lvl - 1] + F.interpolate(
                laterals[lvl], scale_factor=2.0, mode="nearest"
            )
        outs = [getattr(self, self.fpn_names[lvl])(laterals[lvl]) for lvl in range(levels)]
        if self.extra_stage > 0 and not self.has_extra_convs:
            outs.append(F.max_pool2d(outs[-1], 1, stride=2))
        elif self.extra_stage > 0:
            source = feats[-1] if self.use_c5 else outs[-1]
            outs.append(getattr(self, self.fpn_names[levels])(source))
            for i in range(1, self.extra_stage):
                x = F.relu(outs[-1]) if self.relu_before_extra_convs else outs[-1]
                outs.append(getattr(self, self.fpn_names[levels + i])(x))
        return outs
