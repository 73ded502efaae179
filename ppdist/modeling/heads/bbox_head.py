"""BBoxHead with TwoFCHead: Faster R-CNN's second stage (PaddleDetection semantics, initialisers
and parameter names: ``head.fc6``, ``head.fc7``, ``bbox_score``, ``bbox_delta``).

``forward(feats, rois, rois_mask)`` pools the RoIs [B, R, 4] (``roi_extractor``), runs the head
and returns::

    {"bbox_score": [B, R, num_classes + 1] logits (background last),
     "bbox_delta": [B, R, 4 * num_classes],
     "bbox_prob": [B, R, num_classes + 1] softmax, "rois": [B, R, 4], "rois_mask": [B, R]}

In training the RoIs are the sampled ones: the architecture runs the proposal sampling
(``bbox_assigner``, kept as ``self.bbox_assigner`` for it) between the RPN and this head, and the
loss takes the logits, deltas and the sampler's targets.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.heads.roi_extractor import RoIAlign
from ppdist.modeling.heads.settings import checked_settings
from ppdist.registry import HEADS

DEFAULT_ROI_EXTRACTOR = {"resolution": 7, "sampling_ratio": 0, "aligned": True}


def _xavier_uniform(linear: nn.Linear, fan_in: int, fan_out: int) -> None:
    """Paddle's XavierUniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)); bias 0."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(linear.weight, -limit, limit)
    nn.init.zeros_(linear.bias)


def normal_linear(linear: nn.Linear, std: float) -> nn.Linear:
    """Paddle's ``Normal(0, std)`` weight initialiser, bias 0 (the output layers of the box heads)."""
    nn.init.normal_(linear.weight, 0.0, std)
    nn.init.zeros_(linear.bias)
    return linear


def build_roi_extractor(
    settings: Optional[Mapping[str, Any]], feat_strides: Sequence[float], where: str
) -> RoIAlign:
    """A box head's ``RoIAlign``: PaddleDetection's defaults, the config's ``settings`` (checked
    against RoIAlign's keywords), the levels' ``spatial_scale`` from the neck's strides."""
    extractor = dict(DEFAULT_ROI_EXTRACTOR, **checked_settings(RoIAlign, settings, where))
    extractor.setdefault("spatial_scale", [1.0 / float(s) for s in feat_strides])
    return RoIAlign(**extractor)


@HEADS.register
class TwoFCHead(nn.Module):
    """Flatten, fc6 + ReLU, fc7 + ReLU (fc6's Xavier init with ``fan_out = in * S * S``)."""

    def __init__(self, in_channel: int = 256, out_channel: int = 1024, resolution: int = 7) -> None:
        super().__init__()
        self.in_channel = in_channel
        self.out_channel = out_channel
        self.out_channels = out_channel
        fan = in_channel * resolution * resolution
        self.fc6 = nn.Linear(fan, out_channel)
        self.fc7 = nn.Linear(out_channel, out_channel)
        _xavier_uniform(self.fc6, fan, fan)
        _xavier_uniform(self.fc7, out_channel, out_channel)

    def forward(self, rois_feat: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc7(F.relu(self.fc6(rois_feat.flatten(1)))))


@HEADS.register
class BBoxHead(nn.Module):
    """RoI features -> class logits (``num_classes + 1``, background last) and per-class deltas.

    ``head``: ``{"name": "TwoFCHead", ...}`` (or a built module); PaddleDetection derives its input
    channels and the RoI extractor's ``spatial_scale`` from the neck, here ``feat_channel`` and
    ``feat_strides`` (filled by the architecture). ``in_channel`` is the head's output width, as in
    PaddleDetection (taken from the head when not given).
    """

    def __init__(
        self,
        head: Union[Mapping[str, Any], nn.Module, str] = "TwoFCHead",
        in_channel: Optional[int] = None,
        roi_extractor: Optional[Mapping[str, Any]] = None,
        bbox_assigner: Union[Mapping[str, Any], str, None] = "BBoxAssigner",
        with_pool: bool = False,
        num_classes: int = 80,
        bbox_weight: Sequence[float] = (10.0, 10.0, 5.0, 5.0),
        bbox_loss: Optional[Mapping[str, Any]] = None,
        loss_normalize_pos: bool = False,
        feat_channel: int = 256,
        feat_strides: Sequence[float] = (4, 8, 16, 32, 64),
    ) -> None:
        super().__init__()
        if bbox_loss is not None:
            raise ValueError(
                "BBoxHead: bbox_loss is not supported (the box loss is L1, as PaddleDetection's default)"
            )
        self.roi_extractor = build_roi_extractor(roi_extractor, feat_strides, "BBoxHead.roi_extractor")
        self.head = head if isinstance(head, nn.Module) else self._build_head(head, feat_channel)
        in_channel = int(in_channel or self.head.out_channels)
        self.bbox_assigner = bbox_assigner
        self.with_pool = with_pool
        self.num_classes = int(num_classes)
        self.bbox_weight = [float(w) for w in bbox_weight]
        self.loss_normalize_pos = bool(loss_normalize_pos)
        self.out_channels = self.num_classes
        self.bbox_score = normal_linear(nn.Linear(in_channel, self.num_classes + 1), 0.01)
        self.bbox_delta = normal_linear(nn.Linear(in_channel, 4 * self.num_classes), 0.001)

    def _build_head(self, head: Union[Mapping[str, Any], str], feat_channel: int) -> nn.Module:
        cfg = {"name": head} if isinstance(head, str) else dict(head)
        cfg.setdefault("in_channel", feat_channel)
        cfg.setdefault("resolution", self.roi_extractor.resolution)
        return HEADS.build(cfg, where="Architecture.BBoxHead.head")

    def forward(
        self,
        feats: Sequence[torch.Tensor],
        rois: torch.Tensor,
        rois_mask: torch.Tensor,
        im_shape: Optional[torch.Tensor] = None,
        resample: Optional[Callable[..., Dict[str, torch.Tensor]]] = None,
    ) -> Dict[str, torch.Tensor]:
        """``im_shape`` and ``resample`` are for heads that refine their boxes (``CascadeHead``);
        one stage uses neither."""
        batch, count = rois.shape[:2]
        bbox_feat = self.head(self.roi_extractor(feats, rois))
        if self.with_pool:
            bbox_feat = F.adaptive_avg_pool2d(bbox_feat, 1).flatten(1)
        scores = self.bbox_score(bbox_feat).reshape(batch, count, -1)
        deltas = self.bbox_delta(bbox_feat).reshape(batch, count, -1)
        return {
            "bbox_score": scores,
            "bbox_delta": deltas,
            "bbox_prob": torch.softmax(scores.float(), dim=-1),
            "rois": rois,
            "rois_mask": rois_mask,
        }
