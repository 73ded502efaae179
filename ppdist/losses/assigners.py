"""Label assigners for anchor-free detectors (PP-YOLOE): ATSS for the first epochs, then
task-aligned assignment (TAL). Both return, for every anchor of every image:

* ``assigned_labels`` [B, A] int64, ``bg_index`` for background;
* ``assigned_bboxes`` [B, A, 4] xyxy pixels (meaningful for positives only);
* ``assigned_scores`` [B, A, C] soft one-hot targets (0 for background).

Padded ground truths (``pad_gt_mask == 0``) never produce positives. Both run in fp32 with
autocast off and with fixed shapes (no host read of a device value).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from ppdist.losses.precision import full_precision
from ppdist.ops.boxes import box_centers, pairwise_iou, points_inside_boxes

Assignment = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _background(
    batch_size: int, num_anchors: int, num_classes: int, bg_index: int, device: torch.device
) -> Assignment:
    labels = torch.full((batch_size, num_anchors), bg_index, dtype=torch.long, device=device)
    bboxes = torch.zeros((batch_size, num_anchors, 4), device=device)
    scores = torch.zeros((batch_size, num_anchors, num_classes), device=device)
    return labels, bboxes, scores


def class_one_hot(labels: torch.Tensor, num_classes: int, bg_index: int) -> torch.Tensor:
    """Boolean ``[..., num_classes]`` one-hot of ``labels`` in ``0..num_classes`` (``bg_index``
    is one of them and maps to all zeros). A comparison, not ``F.one_hot``, whose range check
    reads the labels on the host (on CPU)."""
    classes = torch.arange(num_classes + 1, device=labels.device)
    classes = torch.cat([classes[:bg_index], classes[bg_index + 1 :]])
    return labels.unsqueeze(-1) == classes


def _topk_mask(metrics: torch.Tensor, k: int, largest: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """0/1 mask [..., L] of the ``k`` best entries along the last axis, and their indices."""
    k = min(k, metrics.shape[-1])
    idx = metrics.topk(k, dim=-1, largest=largest).indices
    mask = torch.zeros_like(metrics).scatter_(-1, idx, 1.0)
    return mask, idx


def _resolve_conflicts(mask_positive: torch.Tensor, ious: torch.Tensor) -> torch.Tensor:
    """Anchors claimed by several gts go to the gt of highest ``ious`` ([B, N, A]) among all gts."""
    multiple = mask_positive.sum(dim=-2, keepdim=True) > 1
    gts = torch.arange(ious.shape[-2], device=ious.device).view(1, -1, 1)
    best = (ious.argmax(dim=-2, keepdim=True) == gts).to(mask_positive.dtype)
    return torch.where(multiple, best, mask_positive)


def _gather_targets(
    mask_positive: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_bboxes: torch.Tensor,
    num_classes: int,
    bg_index: int,
) -> Assignment:
    """Labels, boxes and one-hot scores (bg column dropped) from the final [B, N, A] mask."""
    gt_index = mask_positive.argmax(dim=-2)  # [B, A]; 0 for background anchors
    is_pos = mask_positive.sum(dim=-2) > 0
    labels = gt_labels.squeeze(-1).long().gather(1, gt_index)
    labels = torch.where(is_pos, labels, torch.full_like(labels, bg_index))
    bboxes = gt_bboxes.gather(1, gt_index.unsqueeze(-1).expand(-1, -1, 4))
    scores = class_one_hot(labels, num_classes, bg_index).to(gt_bboxes.dtype)
    return labels, bboxes, scores


def _check_inputs(gt_labels: torch.Tensor, gt_bboxes: torch.Tensor, pad_gt_mask: torch.Tensor) -> None:
    if gt_bboxes.ndim != 3 or gt_bboxes.shape[-1] != 4:
        raise ValueError(f"gt_bboxes must be [B, N, 4], got {tuple(gt_bboxes.shape)}")
    expected = tuple(gt_bboxes.shape[:2]) + (1,)
    for name, t in (("gt_labels", gt_labels), ("pad_gt_mask", pad_gt_mask)):
        if tuple(t.shape) != expected:
            raise ValueError(f"{name} must be [B, N, 1] = {list(expected)}, got {list(t.shape)}")


class ATSSAssigner:
    """Adaptive training sample selection on the grid-cell anchor boxes.

    Per gt: the ``topk`` anchors with the nearest centres on every level are candidates;
    positives have an anchor IoU strictly above mean + (unbiased) std of the candidates'
    IoUs and a centre strictly inside the gt. An anchor claimed by several gts keeps the
    gt of highest anchor IoU. Scores are one-hot, times IoU(predicted box, gt) when
    ``pred_bboxes`` is given.
    """

    def __init__(self, topk: int = 9, num_classes: int = 80, eps: float = 1e-9) -> None:
        if topk < 1:
            raise ValueError(f"ATSSAssigner topk must be >= 1, got {topk}")
        self.topk = topk
        self.num_classes = num_classes
        self.eps = eps

    def _candidates(
        self, distances: torch.Tensor, num_anchors_list: Sequence[int]
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Per level, the ``topk`` anchors nearest each gt: 0/1 mask [B, N, A] and indices."""
        masks: List[torch.Tensor] = []
        idxs: List[torch.Tensor] = []
        start = 0
        for dist in distances.split(list(num_anchors_list), dim=-1):
            mask, idx = _topk_mask(dist, self.topk, largest=False)
            masks.append(mask)
            idxs.append(idx + start)
            start += dist.shape[-1]
        return torch.cat(masks, dim=-1), torch.cat(idxs, dim=-1)

    @torch.no_grad()
    @full_precision
    def __call__(
        self,
        anchors: torch.Tensor,
        num_anchors_list: Sequence[int],
        gt_labels: torch.Tensor,
        gt_bboxes: torch.Tensor,
        pad_gt_mask: torch.Tensor,
        bg_index: Optional[int] = None,
        pred_bboxes: Optional[torch.Tensor] = None,
    ) -> Assignment:
        bg_index = self.num_classes if bg_index is None else bg_index
        _check_inputs(gt_labels, gt_bboxes, pad_gt_mask)
        num_anchors = anchors.shape[0]
        if sum(num_anchors_list) != num_anchors:
            raise ValueError(f"num_anchors_list sums to {sum(num_anchors_list)}, anchors has {num_anchors}")
        batch_size, num_gts, _ = gt_bboxes.shape
        if num_gts == 0:
            return _background(batch_size, num_anchors, self.num_classes, bg_index, anchors.device)
        anchors, gt_bboxes, pad_gt_mask = anchors.float(), gt_bboxes.float(), pad_gt_mask.float()

        ious = pairwise_iou(gt_bboxes.reshape(-1, 4), anchors, eps=1e-10).reshape(
            batch_size, num_gts, num_anchors
        )
        anchor_centers = box_centers(anchors)
        distances = torch.cdist(
            box_centers(gt_bboxes.reshape(-1, 4)), anchor_centers, compute_mode="donot_use_mm_for_euclid_dist"
        )
        in_topk, topk_idx = self._candidates(
            distances.reshape(batch_size, num_gts, num_anchors), num_anchors_list
        )
        in_topk = in_topk * pad_gt_mask

        cand_ious = ious * in_topk
        picked = cand_ious.gather(-1, topk_idx)
        threshold = picked.mean(dim=-1, keepdim=True) + picked.std(dim=-1, keepdim=True)
        in_topk = torch.where(cand_ious > threshold, in_topk, torch.zeros_like(in_topk))

        in_gts = points_inside_boxes(anchor_centers, gt_bboxes, eps=self.eps)
        mask_positive = _resolve_conflicts(in_topk * in_gts * pad_gt_mask, ious)
        labels, bboxes, scores = _gather_targets(
            mask_positive, gt_labels, gt_bboxes, self.num_classes, bg_index
        )
        if pred_bboxes is not None:
            pred_ious = pairwise_iou(gt_bboxes, pred_bboxes.float()) * mask_positive
            scores = scores * pred_ious.amax(dim=-2).unsqueeze(-1)
        return labels, bboxes, scores


class TaskAlignedAssigner:
    """Task-aligned assignment (TOOD) with metric ``t = s**alpha * u**beta``.

    ``s``: predicted probability of the gt class, ``u``: IoU(predicted box, gt). Per gt, the
    ``topk`` anchors by ``t`` among those whose point lies inside the gt are positives; an
    anchor claimed by several gts keeps the gt of highest predicted IoU. Soft score =
    ``t / max_t(gt) * max IoU over that gt's positives``, max over gts, times the one-hot.
    """

    def __init__(
        self, topk: int = 13, alpha: float = 1.0, beta: float = 6.0, num_classes: int = 80, eps: float = 1e-9
    ) -> None:
        if topk < 1:
            raise ValueError(f"TaskAlignedAssigner topk must be >= 1, got {topk}")
        self.topk = topk
        self.alpha = alpha
        self.beta = beta
        self.num_classes = num_classes
        self.eps = eps

    @torch.no_grad()
    @full_precision
    def __call__(
        self,
        pred_scores: torch.Tensor,
        pred_bboxes: torch.Tensor,
        anchor_points: torch.Tensor,
        num_anchors_list: Sequence[int],
        gt_labels: torch.Tensor,
        gt_bboxes: torch.Tensor,
        pad_gt_mask: torch.Tensor,
        bg_index: Optional[int] = None,
    ) -> Assignment:
        bg_index = self.num_classes if bg_index is None else bg_index
        _check_inputs(gt_labels, gt_bboxes, pad_gt_mask)
        batch_size, num_anchors, num_classes = pred_scores.shape
        if num_classes != self.num_classes:
            raise ValueError(
                f"pred_scores has {num_classes} classes, the assigner expects {self.num_classes}"
            )
        num_gts = gt_bboxes.shape[1]
        if num_gts == 0:
            return _background(batch_size, num_anchors, num_classes, bg_index, pred_scores.device)
        pred_scores, pred_bboxes = pred_scores.float(), pred_bboxes.float()
        gt_bboxes, pad_gt_mask = gt_bboxes.float(), pad_gt_mask.float()

        ious = pairwise_iou(gt_bboxes, pred_bboxes)  # [B, N, A]
        cls_index = gt_labels.squeeze(-1).long().clamp(0, num_classes - 1)  # padded labels may be junk
        cls_scores = pred_scores.permute(0, 2, 1).gather(
            1, cls_index.unsqueeze(-1).expand(-1, -1, num_anchors)
        )
        metrics = cls_scores.pow(self.alpha) * ious.pow(self.beta)

        in_gts = points_inside_boxes(anchor_points.float(), gt_bboxes, eps=self.eps)
        in_topk, _ = _topk_mask(metrics * in_gts, self.topk, largest=True)
        mask_positive = in_topk * pad_gt_mask * in_gts
        mask_positive = _resolve_conflicts(mask_positive, ious * pad_gt_mask)
        labels, bboxes, scores = _gather_targets(mask_positive, gt_labels, gt_bboxes, num_classes, bg_index)

        metrics = metrics * mask_positive
        max_metric = metrics.amax(dim=-1, keepdim=True)
        max_iou = (ious * mask_positive).amax(dim=-1, keepdim=True)
        norm = (metrics / (max_metric + self.eps) * max_iou).amax(dim=-2).unsqueeze(-1)
        return labels, bboxes, scores * norm
