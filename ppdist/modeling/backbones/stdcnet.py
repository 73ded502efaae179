"""STDCNet (STDC1 / STDC2), the PP-LiteSeg backbones (PaddleSeg semantics).

Five feature maps at strides 2/4/8/16/32 with ``base // 2, base, 4 base, 8 base, 16 base``
channels. Stages 3-5 stack ``CatBottleneck`` blocks: a 1x1 conv to O/2 channels followed
by a chain of 3x3 convs halving the width, all outputs concatenated (no residual).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from torch import nn

from ppdist.modeling.freezing import FreezableBackbone
from ppdist.modeling.layers import ConvBNAct
from ppdist.registry import BACKBONES


class CatBottleneck(nn.Module):
    """STDC module: ``concat[b1, b2, ..., b_n]`` with widths O/2, O/4, ..., O/2^(n-1), O/2^(n-1).

    With stride 2, ``b1`` is downsampled by a depthwise 3x3 conv + BN before feeding ``b2``
    and by a 3x3 average pool (padding excluded, as Paddle's default) for the concat.
    """

    def __init__(self, in_channels: int, out_channels: int, block_num: int = 4, stride: int = 1) -> None:
        super().__init__()
        if block_num < 2:
            raise ValueError(f"CatBottleneck needs block_num >= 2, got {block_num}")
        self.stride = stride
        half = out_channels // 2
        if stride == 2:
            self.avd_layer = nn.Sequential(
                nn.Conv2d(half, half, 3, stride=2, padding=1, groups=half, bias=False), nn.BatchNorm2d(half)
            )
            self.skip = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)
        convs: List[nn.Module] = [ConvBNAct(in_channels, half, 1)]
        for idx in range(1, block_num):
            c_in = out_channels // 2**idx
            if idx == 1 and block_num == 2:
                c_out = half
            elif idx < block_num - 1:
                c_out = out_channels // 2 ** (idx + 1)
            else:
                c_out = c_in
            convs.append(ConvBNAct(c_in, c_out, 3))
        self.conv_list = nn.ModuleList(convs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.conv_list[0](x)
        out = self.avd_layer(first) if self.stride == 2 else first
        outs = []
        for conv in self.conv_list[1:]:
            out = conv(out)
            outs.append(out)
        if self.stride == 2:
            first = self.skip(first)
        return torch.cat([first] + outs, dim=1)


class STDCNet(FreezableBackbone):
    """STDC backbone returning ``[x2, x4, x8, x16, x32]``; ``out_channels`` lists their widths.

    Units for ``freeze_at`` / ``frozen_stages`` / ``freeze_norm`` (``ppdist.modeling.freezing``):
    the stem (the two stride-2 convolutions, x2 and x4), then the 3 stages of ``layers`` blocks
    (x8, x16, x32)."""

    # Paddle names: PaddleSeg's ``STDCNet`` uses ``features.<i>`` with ``conv`` / ``bn`` (``ConvBNRelu``),
    # ``conv_list`` and ``avd_layer``, as here, so no ``paddle_names``. ImageNet STDC files hold the same
    # names without the ``backbone.`` prefix (converted with ``stage="backbone"``).

    def __init__(
        self,
        base: int = 64,
        layers: Sequence[int] = (4, 5, 3),
        block_num: int = 4,
        in_channels: int = 3,
        freeze_at: Optional[int] = None,
        frozen_stages: Optional[int] = None,
        freeze_norm: bool = False,
    ) -> None:
        super().__init__()
        self.layers = list(layers)
        self.out_channels = [base // 2, base, base * 4, base * 8, base * 16]
        features: List[nn.Module] = [
            ConvBNAct(in_channels, base // 2, 3, stride=2),
            ConvBNAct(base // 2, base, 3, stride=2),
        ]
        for stage, count in enumerate(self.layers):
            width = base * 2 ** (stage + 2)
            for j in range(count):
                if j == 0:
                    features.append(
                        CatBottleneck(base * 2 ** (stage + 1) if stage else base, width, block_num, 2)
                    )
                else:
                    features.append(CatBottleneck(width, width, block_num, 1))
        self.features = nn.Sequential(*features)
        self._init_weights()
        units, start = [list(self.features[:2])], 2
        for count in self.layers:
            units.append(list(self.features[start : start + count]))
            start += count
        self.freeze(units, freeze_at, frozen_stages, freeze_norm)

    def _init_weights(self) -> None:
        """PaddleSeg's STDC init: convs Normal(0, 0.001), BN 1/0 (pretrained weights replace it)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, 0.001)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        feats = []
        x = self.features[0](x)
        feats.append(x)
        x = self.features[1](x)
        feats.append(x)
        start = 2
        for count in self.layers:
            for block in self.features[start : start + count]:
                x = block(x)
            feats.append(x)
            start += count
        return feats


@BACKBONES.register
class STDC1(STDCNet):
    """STDC1: ``[2, 2, 2]`` blocks in stages 3-5 (PP-LiteSeg-T)."""

    def __init__(
        self,
        in_channels: int = 3,
        base: int = 64,
        block_num: int = 4,
        freeze_at: Optional[int] = None,
        frozen_stages: Optional[int] = None,
        freeze_norm: bool = False,
    ) -> None:
        super().__init__(base, (2, 2, 2), block_num, in_channels, freeze_at, frozen_stages, freeze_norm)


@BACKBONES.register
class STDC2(STDCNet):
    """STDC2: ``[4, 5, 3]`` blocks in stages 3-5 (PP-LiteSeg-B)."""

    def __init__(
        self,
        in_channels: int = 3,
        base: int = 64,
        block_num: int = 4,
        freeze_at: Optional[int] = None,
        frozen_stages: Optional[int] = None,
        freeze_norm: bool = False,
    ) -> None:
        super().__init__(base, (4, 5, 3), block_num, in_channels, freeze_at, frozen_stages, freeze_norm)
