"""Res5Head: the C4 Faster R-CNN's RoI head, ResNet's res5 stage run on the pooled RoI features
(PaddleDetection semantics and names: ``res5.res5a.branch2a.conv``, ...).

Three blocks (BottleNeck from 1024 to 2048 channels for depth >= 50, BasicBlock from 256 to 512
otherwise), the first at stride 2, variant ``b`` whatever the backbone's (PaddleDetection builds it
with the block defaults). Its BatchNorms are frozen as PaddleDetection's block defaults
(``freeze_norm``): fixed statistics, parameters untrained. ``BBoxHead`` (``with_pool: true``)
average-pools its output; ``in_channel`` / ``resolution``, which BBoxHead passes to every head,
must match the stage's input width / are any RoI size.
"""

from __future__ import annotations

from typing import Optional

import torch

from ppdist.errors import ConfigError
from ppdist.modeling.backbones.resnet import BasicBlock, BottleNeck, make_stage
from ppdist.modeling.freezing import FreezableBackbone
from ppdist.modeling.layers import init_paddle_conv_default
from ppdist.registry import HEADS


@HEADS.register
class Res5Head(FreezableBackbone):
    """ResNet's res5 on RoI features (module docs)."""

    def __init__(
        self, depth: int = 50, in_channel: Optional[int] = None, resolution: Optional[int] = None
    ) -> None:
        super().__init__()
        block = BottleNeck if depth >= 50 else BasicBlock
        feat_in = 1024 if depth >= 50 else 256
        if in_channel is not None and int(in_channel) != feat_in:
            raise ConfigError(
                f"Res5Head (depth {depth}) takes {feat_in}-channel RoI features, the backbone gives {in_channel}"
            )
        self.res5 = make_stage(block, feat_in, 512, 3, 5, variant="b", groups=1, base_width=64)
        self.out_channels = 512 * block.expansion
        init_paddle_conv_default(self)
        self.freeze([[self.res5]], frozen_stages=-1, freeze_norm=True)

    def forward(self, roi_feat: torch.Tensor) -> torch.Tensor:
        return self.res5(roi_feat)
