"""Faster R-CNN training targets in fixed shapes (issue 43): the RPN anchor
assignment (PaddleDetection's ``RPNTargetAssign``) and the proposal sampling (``BBoxAssigner``).

Ground truth is padded per image with a validity mask; proposals carry a validity mask. Sampling
is a top-k over keys on masks: uniform random keys for ``use_random=True``, ``-index`` for
``use_random=False`` (which takes the first candidates in index order, as PaddleDetection's
``subsample_labels`` does). Nothing reads a tensor value on the host.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ppdist.ops.box_coder import bbox2delta

_BIG = 1 << 30


def pairwise_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """IoU [B, M, N] of ``boxes1`` [B, M, 4] and ``boxes2`` [B, N, 4]; 0 where the boxes do not
    intersect (so zero-area padding gives 0, never NaN)."""
    a = boxes1.unsqueeze(2).unbind(-1)  # x1, y1, x2, y2: [B, M, 1] each
    b = boxes2.unsqueeze(1).unbind(-1)  # [B, 1, N] each
    iw = (torch.minimum(a[2], b[2]) - torch.maximum(a[0], b[0])).clamp_(min=0)
    ih = (torch.minimum(a[3], b[3]) - torch.maximum(a[1], b[1])).clamp_(min=0)
    inter = iw.mul_(ih)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    hit = inter > 0
    return torch.where(hit, inter / torch.where(hit, union, torch.ones_like(union)), 0.0)


def label_boxes(
    boxes: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_mask: torch.Tensor,
    is_crowd: Optional[torch.Tensor],
    positive_overlap: float,
    negative_overlap: float,
    allow_low_quality: bool,
    ignore_thresh: float = -1.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Match ``boxes`` [B, M, 4] to padded ``gt_boxes`` [B, G, 4] -> (matches [B, M] int64,
    labels [B, M] int64 in {-1 ignore, 0 background, 1 foreground}), PaddleDetection's ``label_box``.

    Padding and crowd gt rows take IoU -1; with ``ignore_thresh > 0`` a box over it with a crowd
    box is ignored; an image without a valid non-crowd gt labels every box background (match 0).
    """
    valid = gt_mask.reshape(gt_boxes.shape[:2]).bool()
    crowd = torch.zeros_like(valid) if is_crowd is None else is_crowd.reshape(valid.shape) > 0
    iou = pairwise_iou(gt_boxes, boxes)  # [B, G, M]
    if ignore_thresh > 0:  # a box over a crowd box is ignored: IoU -1 with every gt
        near = ((iou > ignore_thresh) & (crowd & valid)[:, :, None]).any(dim=1, keepdim=True)
        iou = torch.where(near, -1.0, iou)
    iou = torch.where((crowd | ~valid)[:, :, None], -1.0, iou)
    vals, matches = iou.max(dim=1)
    labels = torch.full_like(matches, -1)
    labels = torch.where((vals > -1) & (vals < negative_overlap), 0, labels)
    labels = torch.where(vals >= positive_overlap, 1, labels)
    if allow_low_quality:
        best = iou.max(dim=2, keepdim=True).values
        labels = torch.where(((iou > 0) & (iou == best)).any(dim=1), 1, labels)
    no_gt = ~(valid & ~crowd).any(dim=1, keepdim=True)
    return torch.where(no_gt, 0, matches), torch.where(no_gt, 0, labels)


def _ranked(eligible: torch.Tensor, k: int, use_random: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` highest-keyed eligible candidates per row -> (indices [B, k], eligible [B, k])."""
    m = eligible.shape[1]
    if use_random:
        key = torch.rand(eligible.shape, device=eligible.device)
    else:  # the first candidates in index order
        key = -torch.arange(m, device=eligible.device, dtype=torch.float32).expand(eligible.shape)
    key = torch.where(eligible, key, -float(m) - 1.0)
    idx = key.topk(min(k, m), dim=1).indices
    return idx, eligible.gather(1, idx)


def subsample(
    labels: torch.Tensor, num_samples: int, fg_fraction: float, bg_label: int, use_random: bool
) -> torch.Tensor:
    """PaddleDetection's ``subsample_labels`` in fixed shape: ``min(#fg, int(S * fg_fraction))``
    foreground (label not -1 nor ``bg_label``) then ``min(#bg, S - fg_num)`` background.

    Returns the sampling order [B, M] int64: ``0..fg_num-1`` for the foreground chosen,
    ``num_samples + 0..bg_num-1`` for the background chosen, a large value elsewhere."""
    fg = (labels != -1) & (labels != bg_label)
    bg = labels == bg_label
    fg_cap = int(num_samples * fg_fraction)
    fg_num = fg.sum(dim=1, keepdim=True).clamp(max=fg_cap)
    bg_num = bg.sum(dim=1, keepdim=True).clamp(max=num_samples - fg_num)
    order = torch.full(labels.shape, _BIG, dtype=torch.int64, device=labels.device)
    for mask, num, base in ((fg, fg_num, 0), (bg, bg_num, num_samples)):
        idx, ok = _ranked(mask, fg_cap if base == 0 else num_samples, use_random)
        rank = torch.arange(idx.shape[1], device=labels.device).expand(idx.shape)
        take = ok & (rank < num)
        part = torch.full_like(order, _BIG).scatter(1, idx, torch.where(take, rank + base, _BIG))
        order = torch.minimum(order, part)
    return order


def rpn_anchor_target(
    anchors: torch.Tensor,
    gt_bbox: torch.Tensor,
    gt_mask: torch.Tensor,
    is_crowd: Optional[torch.Tensor] = None,
    batch_size_per_im: int = 256,
    fg_fraction: float = 0.5,
    positive_overlap: float = 0.7,
    negative_overlap: float = 0.3,
    ignore_thresh: float = -1.0,
    use_random: bool = True,
) -> Dict[str, torch.Tensor]:
    """RPN targets: ``anchors`` [A, 4], ``gt_bbox`` [B, G, 4], ``gt_mask`` [B, G(, 1)] ->
    ``{"labels" [B, A] int64 (-1 not sampled, 0 bg, 1 fg), "matched_gt" [B, A, 4],
    "deltas" [B, A, 4] (weights 1), "norm": float}``, ``norm = batch_size_per_im * B``."""
    b = gt_bbox.shape[0]
    boxes = anchors.unsqueeze(0).expand(b, -1, -1)
    matches, labels = label_boxes(
        boxes, gt_bbox, gt_mask, is_crowd, positive_overlap, negative_overlap, True, ignore_thresh
    )
    order = subsample(labels, batch_size_per_im, fg_fraction, 0, use_random)
    sampled = torch.where(labels == 1, 1, 0)
    sampled = torch.where(order < _BIG, sampled, -1)
    matched = gt_bbox.gather(1, matches.unsqueeze(-1).expand(-1, -1, 4))
    deltas = bbox2delta(boxes, matched)
    return {"labels": sampled, "matched_gt": matched, "deltas": deltas, "norm": float(batch_size_per_im * b)}


def box_classes(
    labels: torch.Tensor, matches: torch.Tensor, gt_class: torch.Tensor, num_classes: int
) -> torch.Tensor:
    """Each box's class target from its ``label_boxes`` label and match: the matched gt's class for
    foreground, ``num_classes`` for background, -1 for ignored boxes."""
    cls = gt_class.reshape(gt_class.shape[0], -1).long().gather(1, matches)
    return torch.where(labels == 0, num_classes, torch.where(labels == -1, -1, cls))


def bbox_assign(
    rois: torch.Tensor,
    rois_mask: torch.Tensor,
    gt_bbox: torch.Tensor,
    gt_class: torch.Tensor,
    gt_mask: torch.Tensor,
    num_classes: int,
    is_crowd: Optional[torch.Tensor] = None,
    batch_size_per_im: int = 512,
    fg_fraction: float = 0.25,
    fg_thresh: float = 0.5,
    bg_thresh: float = 0.5,
    ignore_thresh: float = -1.0,
    use_random: bool = True,
    add_gt_as_proposals: bool = True,
) -> Dict[str, torch.Tensor]:
    """Proposal sampling, PaddleDetection's ``BBoxAssigner`` / ``generate_proposal_target``.

    ``rois`` [B, N, 4] with ``rois_mask`` [B, N]; the valid gt boxes are appended as proposals.
    Returns ``batch_size_per_im`` slots per image, foreground first then background, in Paddle's
    order: ``{"rois" [B, S, 4], "rois_mask" [B, S] bool, "tgt_labels" [B, S] int64 (class,
    background = num_classes, -1 in empty slots), "tgt_bboxes" [B, S, 4] the matched gt,
    "tgt_gt_inds" [B, S]}`` (PaddleDetection's target names)."""
    valid_gt = gt_mask.reshape(gt_bbox.shape[:2]).bool()
    boxes, cand = rois, rois_mask.reshape(rois.shape[:2]).bool()
    if add_gt_as_proposals:
        boxes, cand = torch.cat([rois, gt_bbox], 1), torch.cat([cand, valid_gt], 1)
    matches, labels = label_boxes(
        boxes, gt_bbox, gt_mask, is_crowd, fg_thresh, bg_thresh, False, ignore_thresh
    )
    cls = box_classes(torch.where(cand, labels, -1), matches, gt_class, num_classes)
    order = subsample(cls, batch_size_per_im, fg_fraction, num_classes, use_random)
    k = min(batch_size_per_im, order.shape[1])
    slot_order, inds = (-order).topk(k, dim=1)
    ok = -slot_order < _BIG
    gt_inds = matches.gather(1, inds)
    return {
        "rois": boxes.gather(1, inds.unsqueeze(-1).expand(-1, -1, 4)),
        "rois_mask": ok,
        "tgt_labels": torch.where(ok, cls.gather(1, inds), -1),
        "tgt_bboxes": gt_bbox.gather(1, gt_inds.unsqueeze(-1).expand(-1, -1, 4)),
        "tgt_gt_inds": gt_inds,
    }


def cascade_assign(
    rois: torch.Tensor,
    rois_mask: torch.Tensor,
    gt_bbox: torch.Tensor,
    gt_class: torch.Tensor,
    gt_mask: torch.Tensor,
    num_classes: int,
    iou_thresh: float,
    is_crowd: Optional[torch.Tensor] = None,
    ignore_thresh: float = -1.0,
) -> Dict[str, torch.Tensor]:
    """A later Cascade R-CNN stage's targets, PaddleDetection's ``generate_proposal_target`` with
    ``is_cascade``: every box of ``rois`` [B, S, 4] where ``rois_mask`` is set is kept (no sampling,
    no gt appended), foreground at IoU >= ``iou_thresh``, background below it. Returns the same
    keys as ``bbox_assign`` over the same ``S`` slots (``tgt_labels`` -1 where the mask is off or
    the box is ignored next to a crowd box)."""
    mask = rois_mask.reshape(rois.shape[:2]).bool()
    matches, labels = label_boxes(
        rois, gt_bbox, gt_mask, is_crowd, iou_thresh, iou_thresh, False, ignore_thresh
    )
    cls = box_classes(labels, matches, gt_class, num_classes)
    return {
        "rois": rois,
        "rois_mask": mask,
        "tgt_labels": torch.where(mask, cls, -1),
        "tgt_bboxes": gt_bbox.gather(1, matches.unsqueeze(-1).expand(-1, -1, 4)),
        "tgt_gt_inds": matches,
    }
