"""PP-LiteSeg's head: SPPM context module, flexible lightweight decoder (UAFMs) and seg heads.

Input: the backbone's feature list; ``backbone_indices`` picks the 1/8, 1/16 and 1/32 maps.
Output: a list of logits upsampled (bilinear, half-pixel) to the input size — in training
``[main, aux_1/16, aux_1/32]``, in eval ``[main]`` only (PaddleSeg's contract).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.heads.uafm import FUSION_MODULES
from ppdist.modeling.layers import AdaptiveAvgPool2d, ConvBNAct, init_paddle_conv_default
from ppdist.modeling.paddle_names import PaddleNames
from ppdist.ops.resize import upsample_logits
from ppdist.registry import HEADS


class SPPM(nn.Module):
    """Simple pyramid pooling: per bin, avg-pool -> 1x1 ConvBNReLU -> upsample; summed -> 3x3."""

    def __init__(
        self, in_channels: int, inter_channels: int, out_channels: int, bin_sizes: Sequence[int]
    ) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            nn.Sequential(AdaptiveAvgPool2d(size), ConvBNAct(in_channels, inter_channels, 1, bias=True))
            for size in bin_sizes
        )
        self.conv_out = ConvBNAct(inter_channels, out_channels, 3, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[2:]
        out: Optional[torch.Tensor] = None
        for stage in self.stages:
            y = F.interpolate(stage(x), size, mode="bilinear", align_corners=False)
            out = y if out is None else out + y
        return self.conv_out(out)


class SegHead(nn.Module):
    """3x3 ConvBNReLU (no bias) -> 1x1 conv to the classes (no bias)."""

    def __init__(self, in_channels: int, mid_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv = ConvBNAct(in_channels, mid_channels, 3)
        self.conv_out = nn.Conv2d(mid_channels, num_classes, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_out(self.conv(x))


def _per_level(values: Sequence[int], count: int, key: str) -> List[int]:
    values = list(values)
    if len(values) == 1:
        values = values * count
    if len(values) != count:
        raise ValueError(
            f"{key} needs 1 or {count} values (one per backbone_indices entry), got {len(values)}"
        )
    return values


@HEADS.register
class PPLiteSegHead(nn.Module):
    """Everything of PP-LiteSeg after the backbone (PaddleSeg's ``PPLiteSeg`` minus ``backbone``)."""

    # PaddleSeg's ``PPLiteSeg`` keeps the context module and the decoder as ``ppseg_head`` (``cm``,
    # ``arm_list``) and the three segmentation heads beside it as ``seg_heads``; this head holds all of
    # them. PaddleSeg's decoder blocks (``layers.ConvBNReLU`` / ``ConvBN``) name their layers ``_conv``
    # and ``_batch_norm`` where ppdist's ``ConvBNAct`` has ``conv`` and ``bn``; a seg head's 1x1
    # classifier (``conv_out``) is a bare conv in both. tests/convert/test_seg_equivalence.py checks this.
    paddle_names = PaddleNames(
        renames=(
            (r"^(.+)\.conv\.(weight|bias)$", r"\1._conv.\2"),  # ConvBNAct.conv -> ConvBNReLU._conv
            (r"^(.+)\.bn\.(\w+)$", r"\1._batch_norm.\2"),  # ConvBNAct.bn -> ConvBNReLU._batch_norm
        ),
        prefix="ppseg_head",
        beside_stage=("seg_heads",),
    )

    def __init__(
        self,
        in_channels: Sequence[int],
        num_classes: int,
        backbone_indices: Sequence[int] = (2, 3, 4),
        arm_type: str = "UAFM_SpAtten",
        cm_bin_sizes: Sequence[int] = (1, 2, 4),
        cm_out_ch: int = 128,
        arm_out_chs: Sequence[int] = (64, 96, 128),
        seg_head_inter_chs: Sequence[int] = (64, 64, 64),
        resize_mode: str = "bilinear",
    ) -> None:
        super().__init__()
        if not isinstance(in_channels, (list, tuple)):
            raise ValueError("PPLiteSegHead needs a backbone that returns a list of feature maps")
        if len(backbone_indices) < 2 or max(backbone_indices) >= len(in_channels):
            raise ValueError(
                f"backbone_indices {list(backbone_indices)} must hold >= 2 indices into the "
                f"backbone's {len(in_channels)} feature maps"
            )
        if arm_type not in FUSION_MODULES:
            raise ValueError(f"arm_type must be one of {sorted(FUSION_MODULES)}, got {arm_type!r}")
        if num_classes is None or num_classes <= 0:
            raise ValueError("num_classes must be a positive integer (set Global.num_classes)")
        levels = len(backbone_indices)
        self.backbone_indices = list(backbone_indices)
        arm_out_chs = _per_level(arm_out_chs, levels, "arm_out_chs")
        seg_head_inter_chs = _per_level(seg_head_inter_chs, levels, "seg_head_inter_chs")
        feat_chs = [in_channels[i] for i in backbone_indices]
        self.cm = SPPM(feat_chs[-1], cm_out_ch, cm_out_ch, cm_bin_sizes)
        fusion = FUSION_MODULES[arm_type]
        self.arm_list = nn.ModuleList(
            fusion(
                feat_chs[i],
                cm_out_ch if i == levels - 1 else arm_out_chs[i + 1],
                arm_out_chs[i],
                ksize=3,
                resize_mode=resize_mode,
            )
            for i in range(levels)
        )
        self.seg_heads = nn.ModuleList(
            SegHead(c, m, num_classes) for c, m in zip(arm_out_chs, seg_head_inter_chs)
        )
        self.out_channels = num_classes
        init_paddle_conv_default(self)

    def forward(
        self, feats: Sequence[torch.Tensor], input_size: Optional[Sequence[int]] = None
    ) -> List[torch.Tensor]:
        selected = [feats[i] for i in self.backbone_indices]
        high = self.cm(selected[-1])
        fused: List[torch.Tensor] = []
        for i in reversed(range(len(selected))):
            high = self.arm_list[i](selected[i], high)
            fused.insert(0, high)
        size = list(input_size) if input_size is not None else [s * 8 for s in fused[0].shape[2:]]
        heads = self.seg_heads if self.training else self.seg_heads[:1]
        return [upsample_logits(head(x), size, align_corners=False) for head, x in zip(heads, fused)]
