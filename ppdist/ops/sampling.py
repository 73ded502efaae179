"""Matching candidate boxes to ground truth and sampling them, in fixed shapes (PaddleDetection's
``label_box`` and ``subsample_labels`` without a host read): candidates and ground truth come padded
with validity masks, and the random choice is a top-k over random keys.

Labels are 1 (foreground), 0 (background) and -1 (ignored or padding).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from ppdist.ops.boxes import pairwise_iou


def ground_truth(batch: Mapping[str, Any], like: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The batch's padded ground truth on ``like``'s device: boxes [B, G, 4], classes [B, G] and the
    validity mask [B, G] (``pad_gt_mask``; every row valid without it)."""
    boxes = torch.as_tensor(batch["gt_bbox"], device=like.device).float().reshape(like.shape[0], -1, 4)
    classes = torch.as_tensor(batch["gt_class"], device=like.device).long().reshape(boxes.shape[:2])
    mask = batch.get("pad_gt_mask")
    valid = (
        torch.as_tensor(mask, device=like.device).reshape(boxes.shape[:2]) > 0
        if mask is not None
        else torch.ones(boxes.shape[:2], dtype=torch.bool, device=like.device)
    )
    return {"boxes": boxes, "classes": classes, "valid": valid}


def match_boxes(
    boxes: torch.Tensor,
    boxes_valid: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_valid: torch.Tensor,
    positive_overlap: float,
    negative_overlap: float,
    allow_low_quality: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(matches [B, N], labels [B, N])`` of candidates ``boxes`` [B, N, 4] against ``gt_boxes``
    [B, G, 4]: the best-overlapping ground truth of each candidate (the first on ties), foreground
    at IoU >= ``positive_overlap``, background under ``negative_overlap``; with
    ``allow_low_quality`` also every candidate that is some ground truth's best (IoU > 0). An image
    without ground truth is all background, as in PaddleDetection."""
    iou = pairwise_iou(boxes.float(), gt_boxes.float(), eps=0.0).nan_to_num(0.0)  # [B, N, G]
    iou = torch.where(gt_valid.unsqueeze(1), iou, torch.full_like(iou, -1.0))
    values, matches = iou.max(dim=-1)
    labels = torch.full_like(matches, -1)
    labels = torch.where((values > -1) & (values < negative_overlap), torch.zeros_like(labels), labels)
    labels = torch.where(values >= positive_overlap, torch.ones_like(labels), labels)
    if allow_low_quality:
        best = iou.masked_fill(~boxes_valid.unsqueeze(-1), -1.0).max(dim=1, keepdim=True).values
        hit = ((iou > 0) & (iou == best) & gt_valid.unsqueeze(1)).any(dim=-1)
        labels = torch.where(hit, torch.ones_like(labels), labels)
    has_gt = gt_valid.any(dim=-1, keepdim=True)
    labels = torch.where(has_gt, labels, torch.zeros_like(labels))
    matches = torch.where(has_gt, matches, torch.zeros_like(matches))
    labels = torch.where(boxes_valid, labels, torch.full_like(labels, -1))
    return matches, labels


def sample_labels(
    labels: torch.Tensor,
    num_samples: int,
    fg_fraction: float,
    use_random: bool,
    generator: Optional[torch.Generator] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(fg [B, N], bg [B, N])`` bool: up to ``int(num_samples * fg_fraction)`` foreground
    candidates and background ones up to ``num_samples`` in all, per image; random subsets with
    ``use_random`` (uniform, as PaddleDetection's permutation), else the first ones in order."""
    count = labels.shape[1]
    if use_random:
        keys = torch.rand(labels.shape, device=labels.device, generator=generator)
    else:  # the lowest indices first
        keys = -torch.arange(count, device=labels.device, dtype=torch.float32).expand(labels.shape)
    fg = _top(labels == 1, keys, min(int(num_samples * fg_fraction), count), None)
    quota = num_samples - fg.sum(dim=1, keepdim=True)
    bg = _top(labels == 0, keys, min(num_samples, count), quota)
    return fg, bg


def _top(candidates: torch.Tensor, keys: torch.Tensor, k: int, quota: Optional[torch.Tensor]) -> torch.Tensor:
    """The ``k`` (and at most ``quota`` per row) candidates of the largest keys, as a mask."""
    chosen = torch.zeros_like(candidates)
    if k <= 0:
        return chosen
    values, index = torch.where(candidates, keys, torch.full_like(keys, -float("inf"))).topk(k, dim=1)
    take = torch.isfinite(values)
    if quota is not None:
        take = take & (torch.arange(k, device=keys.device) < quota)
    return chosen.scatter(1, index, take)


def compact(mask: torch.Tensor, size: int) -> torch.Tensor:
    """Indices [B, min(size, N)] putting each row's selected entries first (in index order)."""
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    return order[:, : min(size, mask.shape[1])]
