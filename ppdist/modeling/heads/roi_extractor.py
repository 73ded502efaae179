"""RoIAlign: PaddleDetection's RoI extractor over FPN levels (``start_level..end_level`` of the
feature list, e.g. P2..P5 of P2..P6), fixed shapes (``ops.roi_align``)."""

from __future__ import annotations

from typing import Sequence, Union

import torch
from torch import nn

from ppdist.ops.roi_align import fpn_levels, multi_level_roi_align

# feature level of the first map (P2): the offset between list indices and FPN levels
FIRST_LEVEL = 2


class RoIAlign(nn.Module):
    """Pools ``resolution`` x ``resolution`` features per RoI.

    Keyword names are PaddleDetection's (``canconical_level`` with its spelling). As in
    PaddleDetection 2.7.1, ``aligned`` is accepted and not applied: its RoIAlign always pools with
    ``aligned=False`` (the legacy half-pixel-free sampling, RoIs at least 1 px), so converted
    models see the features they were trained on. ``spatial_scale``: ``1 / stride`` per level.
    """

    def __init__(
        self,
        resolution: int = 14,
        spatial_scale: Union[float, Sequence[float]] = 0.0625,
        sampling_ratio: int = 0,
        canconical_level: int = 4,
        canonical_size: int = 224,
        start_level: int = 0,
        end_level: int = 3,
        aligned: bool = False,
    ) -> None:
        super().__init__()
        self.resolution = int(resolution)
        scales = spatial_scale if isinstance(spatial_scale, (list, tuple)) else [spatial_scale]
        self.spatial_scale = [float(s) for s in scales]
        self.sampling_ratio = int(sampling_ratio)
        self.canconical_level = int(canconical_level)
        self.canonical_size = int(canonical_size)
        self.start_level = int(start_level)
        self.end_level = int(end_level)
        self.aligned = bool(aligned)  # recorded only, see the class docstring

    def forward(self, feats: Sequence[torch.Tensor], rois: torch.Tensor) -> torch.Tensor:
        """``rois`` [B, R, 4] xyxy in input pixels -> [B * R, C, S, S] (image-major)."""
        if len(feats) == 1:
            levels = torch.zeros(rois.shape[:2], dtype=torch.long, device=rois.device)
            return multi_level_roi_align(feats, rois, self.spatial_scale[:1], levels, self.resolution, -1)
        if len(self.spatial_scale) < self.end_level + 1 or len(feats) < self.end_level + 1:
            raise ValueError(
                f"RoIAlign pools levels {self.start_level}..{self.end_level} but got {len(feats)} feature maps "
                f"and {len(self.spatial_scale)} spatial_scale values"
            )
        low, high = self.start_level + FIRST_LEVEL, self.end_level + FIRST_LEVEL
        levels = fpn_levels(rois, low, high, self.canconical_level, self.canonical_size) - FIRST_LEVEL
        return multi_level_roi_align(
            feats[: self.end_level + 1],
            rois,
            self.spatial_scale[: self.end_level + 1],
            levels,
            self.resolution,
            self.sampling_ratio,
            aligned=False,
        )
