"""RoIAlign over FPN levels with PaddleDetection's level rule, in fixed shapes: each RoI is pooled
from the level ``floor(canonical_level + log2(sqrt(area) / canonical_size + 1e-6))`` (clamped to
the pooled levels), every level's ``torchvision.ops.roi_align`` sees all RoIs, the ones of other
levels as empty boxes (one sample per bin: cheap) whose outputs are dropped. No host read."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ppdist.ops.ranges import index_range


def _roi_align() -> Callable[..., torch.Tensor]:
    """``torchvision.ops.roi_align``, imported on first use (torchvision.ops loads torch._dynamo)."""
    from torchvision.ops import roi_align  # noqa: PLC0415  (heavy: loads torch._dynamo, about 3 s)

    return roi_align


def fpn_levels(
    rois: torch.Tensor, min_level: int, max_level: int, canonical_level: int = 4, canonical_size: float = 224
) -> torch.Tensor:
    """The FPN level (``min_level..max_level``, e.g. 2..5) of each xyxy RoI [..., 4], as Paddle's
    ``distribute_fpn_proposals`` (areas without the +1; an inverted box has area 0)."""
    w = rois[..., 2] - rois[..., 0]
    h = rois[..., 3] - rois[..., 1]
    area = torch.where((w < 0) | (h < 0), torch.zeros_like(w), w * h)
    level = torch.floor(torch.log2(torch.sqrt(area) / canonical_size + 1e-6) + canonical_level)
    return level.clamp(min_level, max_level).long()


def with_batch_index(rois: torch.Tensor) -> torch.Tensor:
    """[B, R, 4] -> torchvision's [B * R, 5] rows ``(image, x1, y1, x2, y2)``."""
    batch, count = rois.shape[:2]
    image = index_range(batch, rois).to(rois.dtype)[:, None, None].expand(batch, count, 1)
    return torch.cat([image, rois], dim=2).reshape(-1, 5)


def multi_level_roi_align(
    feats: Sequence[torch.Tensor],
    rois: torch.Tensor,
    spatial_scales: Sequence[float],
    levels: torch.Tensor,
    output_size: int,
    sampling_ratio: int = 0,
    aligned: bool = False,
) -> torch.Tensor:
    """RoIAlign of ``rois`` [B, R, 4] (input pixels) -> [B * R, C, S, S] float32 (float64 for
    float64 features): RoI ``r`` from ``feats[levels[r]]`` (``levels`` [B, R] indexes ``feats`` /
    ``spatial_scales``). In float32 whatever a lower feature dtype (as torchvision's autocast
    rule): RoI corners in bfloat16 would move by up to 4 px past 1024 px."""
    roi_align = _roi_align()
    dtype = torch.promote_types(feats[0].dtype, torch.float32)
    boxes = with_batch_index(rois.to(dtype))
    flat_levels = levels.reshape(-1)
    out = None
    for level, (feat, scale) in enumerate(zip(feats, spatial_scales)):
        here = flat_levels == level
        level_boxes = torch.where(here[:, None], boxes, boxes * here[:, None].to(boxes.dtype))
        level_boxes = torch.cat([boxes[:, :1], level_boxes[:, 1:]], dim=1)  # elsewhere: empty boxes
        pooled = roi_align(feat.to(dtype), level_boxes, output_size, scale, sampling_ratio, aligned)
        chosen = here[:, None, None, None]
        out = (
            torch.where(chosen, pooled, torch.zeros_like(pooled))
            if out is None
            else torch.where(chosen, pooled, out)
        )
    return out
