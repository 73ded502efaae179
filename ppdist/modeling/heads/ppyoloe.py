"""PPYOLOEHead, the efficient task-aligned head of PP-YOLOE (PaddleDetection semantics).

Per level, cls and reg each have an ESE attention stem; ``cls = pred_cls(stem_cls + feat)``,
``reg = pred_reg(stem_reg)`` with ``4 * (reg_max + 1)`` distribution-focal bins per side.
Levels are concatenated in ``fpn_strides`` order (32, 16, 8).

Training returns raw logits plus anchors (for the assigners and losses)::

    {"cls_logits": [B, A, C], "reg_distri": [B, A, 4 * (reg_max + 1)], "anchors": [A, 4] xyxy px,
     "anchor_points": [A, 2] px, "num_anchors_list": [int per level], "stride_tensor": [A, 1]}

Eval returns ``{"scores": [B, C, A] sigmoid, "boxes": [B, A, 4] xyxy in input pixels}``, in fp32
also under autocast.
Anchors are always derived from the feature shapes (cached), in float32 whatever the autocast
dtype, so any input size works.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.backbones.cspresnet import ConvBN
from ppdist.modeling.layers import (
    NormNoDecayModule,
    at_least_fp32,
    init_paddle_conv_default,
    tag_norm_no_decay,
)
from ppdist.modeling.paddle_names import PaddleNames
from ppdist.ops.ranges import Length, index_range
from ppdist.registry import HEADS

AnchorSet = Tuple[torch.Tensor, torch.Tensor, List[int], torch.Tensor]


def generate_anchors(
    feats_shapes: Sequence[Tuple[Length, Length]],
    strides: Sequence[int],
    grid_cell_scale: float = 5.0,
    grid_cell_offset: float = 0.5,
    like: Optional[torch.Tensor] = None,
) -> AnchorSet:
    """Grid anchors for feature maps of sizes ``(h, w)`` at ``strides``, in float32 on the device
    of ``like`` (a feature map; the CPU without one). Float32 whatever ``like``'s dtype: in bf16
    the anchor points would move by up to 4 px past 1024 px (8 bits of mantissa).

    Returns ``anchors`` [A, 4] (xyxy squares of side ``grid_cell_scale * stride``),
    ``anchor_points`` [A, 2] (pixel centres ``((j + offset) s, (i + offset) s)``),
    ``num_anchors_list`` and ``stride_tensor`` [A, 1]; levels in the given order. The sizes may be
    symbolic (traced) shape values: an exported graph then computes the anchors for any input size,
    and records no device (the ranges are made from ``like``: ``ops.index_range``).
    """
    if len(feats_shapes) != len(strides):
        raise ValueError(f"{len(feats_shapes)} feature maps but {len(strides)} strides")
    like = torch.zeros(()) if like is None else like
    anchors, points, counts, stride_list = [], [], [], []
    for (h, w), stride in zip(feats_shapes, strides):
        half = grid_cell_scale * stride * 0.5
        xs = (index_range(w, like, torch.float32) + grid_cell_offset) * stride
        ys = (index_range(h, like, torch.float32) + grid_cell_offset) * stride
        yy, xx = torch.meshgrid(ys, xs, indexing="ij")
        point = torch.stack([xx, yy], dim=-1).reshape(-1, 2)
        points.append(point)
        anchors.append(torch.cat([point - half, point + half], dim=-1))
        counts.append(point.shape[0])
        stride_list.append(torch.ones_like(point[:, :1]) * float(stride))
    return torch.cat(anchors), torch.cat(points), counts, torch.cat(stride_list)


def distance2bbox(points: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """xyxy boxes from points [..., 2] and ltrb distances [..., 4] (broadcasting)."""
    lt, rb = distance.split(2, dim=-1)
    return torch.cat([points - lt, points + rb], dim=-1)


class ESEAttn(nn.Module):
    """``ConvBN1x1+act(feat * sigmoid(fc(avg_feat)))``; fc weights N(0, 0.001), bias 0."""

    def __init__(self, channels: int, act: Optional[str] = "swish") -> None:
        super().__init__()
        self.fc = nn.Conv2d(channels, channels, 1, bias=True)
        self.conv = ConvBN(channels, channels, 1, act=act)

    def init_weights(self) -> None:
        nn.init.normal_(self.fc.weight, 0.0, 0.001)
        nn.init.zeros_(self.fc.bias)

    def forward(self, feat: torch.Tensor, avg_feat: torch.Tensor) -> torch.Tensor:
        return self.conv(feat * torch.sigmoid(self.fc(avg_feat)))


@HEADS.register
class PPYOLOEHead(NormNoDecayModule):
    """Anchor-free head with DFL box regression; see the module docstring for the outputs."""

    # PaddleDetection's ``YOLOv3`` architecture calls the PP-YOLOE head ``yolo_head``; inside it the
    # names are PaddleDetection's (``stem_cls`` / ``stem_reg`` / ``pred_cls`` / ``pred_reg``). Its frozen
    # DFL projection ``proj_conv.weight`` (0..reg_max) is the constant ``proj`` here, checked on conversion.
    paddle_names = PaddleNames(prefix="yolo_head", constants=(("proj_conv.weight", "proj"),))

    def __init__(
        self,
        in_channels: Sequence[int],
        num_classes: int = 80,
        fpn_strides: Sequence[int] = (32, 16, 8),
        grid_cell_scale: float = 5.0,
        grid_cell_offset: float = 0.5,
        reg_max: int = 16,
        act: str = "swish",
        eval_size: Optional[Sequence[int]] = None,
    ) -> None:
        super().__init__()
        if not isinstance(in_channels, (list, tuple)) or len(in_channels) != len(fpn_strides):
            raise ValueError(
                f"PPYOLOEHead needs one input map per fpn_strides entry "
                f"({len(fpn_strides)}), got in_channels={in_channels!r}"
            )
        if num_classes is None or num_classes <= 0:
            raise ValueError("num_classes must be a positive integer")
        self.in_channels = list(in_channels)
        self.num_classes = num_classes
        self.fpn_strides = [int(s) for s in fpn_strides]
        self.grid_cell_scale = grid_cell_scale
        self.grid_cell_offset = grid_cell_offset
        self.reg_max = reg_max
        self.eval_size = list(eval_size) if eval_size else None  # accepted for config parity only
        self.out_channels = num_classes
        bins = reg_max + 1
        self.stem_cls = nn.ModuleList(ESEAttn(c, act) for c in self.in_channels)
        self.stem_reg = nn.ModuleList(ESEAttn(c, act) for c in self.in_channels)
        self.pred_cls = nn.ModuleList(nn.Conv2d(c, num_classes, 3, padding=1) for c in self.in_channels)
        self.pred_reg = nn.ModuleList(nn.Conv2d(c, 4 * bins, 3, padding=1) for c in self.in_channels)
        # Paddle's frozen 1x1 ``proj_conv`` (weights 0..reg_max): a constant, not a parameter
        self.register_buffer("proj", torch.arange(bins, dtype=torch.float32), persistent=False)
        self._anchor_cache: Dict[tuple, AnchorSet] = {}
        self._init_weights()
        tag_norm_no_decay(self)

    def _init_weights(self) -> None:
        init_paddle_conv_default(self)
        for stem in list(self.stem_cls) + list(self.stem_reg):
            stem.init_weights()
        bias_cls = -math.log((1 - 0.01) / 0.01)
        for cls_conv, reg_conv in zip(self.pred_cls, self.pred_reg):
            nn.init.zeros_(cls_conv.weight)
            nn.init.constant_(cls_conv.bias, bias_cls)
            nn.init.zeros_(reg_conv.weight)
            nn.init.constant_(reg_conv.bias, 1.0)

    def anchors_for(self, feats: Sequence[torch.Tensor]) -> AnchorSet:
        """``generate_anchors`` (float32 also under autocast) for these feature maps, cached by
        shapes and device.

        Under ``torch.compile`` the cache is bypassed: dynamo guards on the dict's contents, so
        each new multi-scale size would invalidate every compiled graph (29 compiles in 60 random
        steps over PP-YOLOE's 15 sizes); built inside the graph, the anchors follow its sizes.
        """
        if torch.compiler.is_compiling():
            shapes = [(f.shape[2], f.shape[3]) for f in feats]
            return generate_anchors(
                shapes, self.fpn_strides, self.grid_cell_scale, self.grid_cell_offset, feats[0]
            )
        key = (tuple((int(f.shape[2]), int(f.shape[3])) for f in feats), feats[0].device)
        cached = self._anchor_cache.get(key)
        if cached is None:
            if len(self._anchor_cache) >= 16:
                self._anchor_cache.clear()
            cached = generate_anchors(
                key[0], self.fpn_strides, self.grid_cell_scale, self.grid_cell_offset, feats[0]
            )
            self._anchor_cache[key] = cached
        return cached

    def _level(self, i: int, feat: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        avg = F.adaptive_avg_pool2d(feat, 1)
        cls_logit = self.pred_cls[i](self.stem_cls[i](feat, avg) + feat)
        reg = self.pred_reg[i](self.stem_reg[i](feat, avg))
        return cls_logit, reg

    def decode_distances(self, reg_distri: torch.Tensor) -> torch.Tensor:
        """Expected ltrb distances (stride units) [..., 4] from DFL logits [..., 4 * (reg_max + 1)]."""
        probs = reg_distri.reshape(*reg_distri.shape[:-1], 4, self.reg_max + 1).softmax(dim=-1)
        return (probs * self.proj.to(probs.dtype)).sum(dim=-1)

    def forward(
        self, feats: Sequence[torch.Tensor], input_size: Optional[Sequence[int]] = None
    ) -> Dict[str, object]:
        if len(feats) != len(self.fpn_strides):
            raise ValueError(f"PPYOLOEHead got {len(feats)} maps for {len(self.fpn_strides)} strides")
        cls_list, reg_list = [], []
        for i, feat in enumerate(feats):
            cls_logit, reg = self._level(i, feat)
            cls_list.append(cls_logit.flatten(2))  # [B, C, l]
            reg_list.append(reg.flatten(2))  # [B, 4 * bins, l]
        anchors, anchor_points, num_anchors_list, stride_tensor = self.anchors_for(feats)
        reg_distri = torch.cat(reg_list, dim=2).transpose(1, 2)  # [B, A, 4 * bins]
        if self.training:
            return {
                "cls_logits": torch.cat(cls_list, dim=2).transpose(1, 2),
                "reg_distri": reg_distri,
                "anchors": anchors,
                "anchor_points": anchor_points,
                "num_anchors_list": list(num_anchors_list),
                "stride_tensor": stride_tensor,
            }
        if (
            torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()
        ):  # symbolic sizes: the graph takes any size
            _, anchor_points, _, stride_tensor = generate_anchors(
                [(f.shape[2], f.shape[3]) for f in feats],
                self.fpn_strides,
                self.grid_cell_scale,
                self.grid_cell_offset,
                feats[0],
            )
        # fp32 whatever the autocast state: fp16 sigmoids tie in COCO's score ranking
        scores = at_least_fp32(torch.cat(cls_list, dim=2)).sigmoid()
        dist = self.decode_distances(at_least_fp32(reg_distri))
        boxes = distance2bbox(anchor_points / stride_tensor, dist) * stride_tensor
        return {"scores": scores, "boxes": boxes}
