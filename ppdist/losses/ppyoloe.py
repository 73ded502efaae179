"""PP-YOLOE's training loss: ATSS / task-aligned assignment, varifocal (or focal)
classification loss, GIoU and distribution focal loss on the positives.

Everything is computed in FP32, with autocast off, and with fixed shapes: the positives enter
through masks, never through boolean indexing, so a step reads nothing on the host (the GPU never
waits). Every term is divided by ``S``, the sum of the soft
targets averaged over ranks (all-reduced when ``torch.distributed`` is initialised) and
clamped to >= 1, so that with DDP's gradient averaging the effective loss is the global
sum over the global ``S``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ppdist.losses.assigners import ATSSAssigner, TaskAlignedAssigner, class_one_hot
from ppdist.losses.normalizer import NORMALIZER_KEY
from ppdist.losses.precision import full_precision
from ppdist.ops.boxes import bbox2distance, distance2bbox, giou
from ppdist.registry import LOSSES

_DEFAULT_WEIGHTS = {"class": 1.0, "iou": 2.5, "dfl": 0.5}
_DEFAULT_STATIC = {"name": "ATSSAssigner", "topk": 9}
_DEFAULT_DYNAMIC = {"name": "TaskAlignedAssigner", "topk": 13, "alpha": 1.0, "beta": 6.0}
_ASSIGNER_KEYS = {"ATSSAssigner": ("topk",), "TaskAlignedAssigner": ("topk", "alpha", "beta")}


def varifocal_loss(
    logits: torch.Tensor,
    gt_score: torch.Tensor,
    one_hot: torch.Tensor,
    alpha: float = 0.75,
    gamma: float = 2.0,
) -> torch.Tensor:
    """Summed VFL: ``BCE(p, q) * (alpha * p**gamma * (1 - onehot) + q * onehot)``, ``p = sigmoid(logits)``.

    The weight is not detached (gradients flow through ``p**gamma``)."""
    pred = logits.sigmoid()
    weight = alpha * pred.pow(gamma) * (1.0 - one_hot) + gt_score * one_hot
    bce = F.binary_cross_entropy_with_logits(logits, gt_score, reduction="none")
    return (bce * weight).sum()


def sigmoid_focal_loss(
    logits: torch.Tensor, gt_score: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0
) -> torch.Tensor:
    """Summed focal loss on soft targets: ``BCE(p, q) * |p - q|**gamma * alpha_t``
    (``alpha_t = alpha*q + (1-alpha)*(1-q)``; no alpha term when ``alpha <= 0``)."""
    weight = (logits.sigmoid() - gt_score).abs().pow(gamma)
    if alpha > 0:
        weight = weight * (alpha * gt_score + (1.0 - alpha) * (1.0 - gt_score))
    bce = F.binary_cross_entropy_with_logits(logits, gt_score, reduction="none")
    return (bce * weight).sum()


def giou_loss(pred: torch.Tensor, target: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    """Per-box ``1 - GIoU`` of aligned ``[..., 4]`` boxes."""
    return 1.0 - giou(pred, target, eps=eps)


def distribution_focal_loss(pred_logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DFL per box ``[P]`` from bin logits ``[P, 4, R+1]`` and distances ``[P, 4]`` in ``[0, R)``:
    cross entropy to the two neighbouring bins weighted by proximity, averaged over the sides."""
    log_probs = F.log_softmax(pred_logits, dim=-1)
    # targets lie in [0, R - 0.01] (bbox2distance): the clamp only keeps a NaN target (a diverged
    # step, to be reported or skipped) from indexing outside the bins; its loss stays NaN
    left = target.floor().long().clamp(0, pred_logits.shape[-1] - 2)
    right = left + 1
    weight_left = right.to(target.dtype) - target
    weight_right = 1.0 - weight_left
    ce_left = -log_probs.gather(-1, left.unsqueeze(-1)).squeeze(-1)
    ce_right = -log_probs.gather(-1, right.unsqueeze(-1)).squeeze(-1)
    return (ce_left * weight_left + ce_right * weight_right).mean(dim=-1)


NORMALIZER_FLOOR = 1.0


def _global_normaliser(scores_sum: torch.Tensor) -> torch.Tensor:
    """``S`` summed over ranks / world size (no gradient), before the floor ``NORMALIZER_FLOOR``."""
    total = scores_sum.detach().clone()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        total = total / dist.get_world_size()
    return total


def _assigner_kwargs(
    cfg: Optional[Mapping[str, Any]], default: Mapping[str, Any], field: str
) -> Dict[str, Any]:
    """Validated constructor kwargs of the assigner config ``{name: ..., **kwargs}``."""
    expected = default["name"]
    if cfg is None:
        cfg = default
    if not isinstance(cfg, Mapping):
        raise ValueError(f"PPYOLOELoss {field} must be a mapping like {dict(default)}, got {cfg!r}")
    name = cfg.get("name", expected)
    if name != expected:
        raise ValueError(f"PPYOLOELoss {field} must be named {expected!r}, got {name!r}")
    allowed = _ASSIGNER_KEYS[expected]
    unknown = sorted(set(cfg) - set(allowed) - {"name"})
    if unknown:
        raise ValueError(
            f"PPYOLOELoss {field} ({expected}) has unknown keys {unknown}; "
            f"valid keys: {['name', *allowed]} (num_classes comes from the loss)"
        )
    kwargs = {k: cfg.get(k, default[k]) for k in allowed}
    topk = kwargs["topk"]
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"PPYOLOELoss {field}.topk must be a positive int, got {topk!r}")
    for key in ("alpha", "beta"):
        value = kwargs.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"PPYOLOELoss {field}.{key} must be a number, got {value!r}")
    return kwargs


def _loss_weights(weights: Optional[Mapping[str, float]]) -> Dict[str, float]:
    merged = dict(_DEFAULT_WEIGHTS)
    if weights is not None:
        unknown = sorted(set(weights) - set(_DEFAULT_WEIGHTS))
        if unknown:
            raise ValueError(
                f"PPYOLOELoss loss_weight has unknown keys {unknown}; valid keys: {sorted(_DEFAULT_WEIGHTS)}"
            )
        merged.update({k: float(v) for k, v in weights.items()})
    return merged


@LOSSES.register
class PPYOLOELoss(nn.Module):
    """``forward(preds, batch) -> {loss, loss_cls, loss_iou, loss_dfl, loss_l1}``.

    ``preds`` (training output of the PP-YOLOE head): ``cls_logits`` [B, A, C],
    ``reg_distri`` [B, A, 4*(reg_max+1)] (side-major: 4 groups of reg_max+1 bin logits, ltrb),
    ``anchors`` [A, 4] xyxy pixel grid-cell boxes, ``anchor_points`` [A, 2] pixels,
    ``num_anchors_list`` anchors per level, ``stride_tensor`` [A, 1].
    ``batch``: ``gt_class`` [B, N, 1] int, ``gt_bbox`` [B, N, 4] xyxy pixels, ``pad_gt_mask``
    [B, N, 1] (1 real, 0 padding; derived from non-zero boxes when absent) and ``epoch_id``
    (0-based): ATSS while ``epoch_id < static_assigner_epoch``, then TAL.
    ``loss = w_class*cls + w_iou*iou + w_dfl*dfl``; ``loss_l1`` is logged only.
    """

    epoch_dependent = True  # reads ``epoch_id`` on the host (a captured step could not follow it)

    def __init__(
        self,
        num_classes: int = 80,
        reg_max: int = 16,
        static_assigner_epoch: int = 100,
        use_varifocal_loss: bool = True,
        loss_weight: Optional[Dict[str, float]] = None,
        static_assigner: Optional[Dict[str, Any]] = None,
        assigner: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__()
        if num_classes < 1 or reg_max < 1:
            raise ValueError(
                f"PPYOLOELoss needs num_classes >= 1 and reg_max >= 1, got {num_classes}, {reg_max}"
            )
        self.num_classes = num_classes
        self.normalizer_floor = NORMALIZER_FLOOR  # see ppdist.losses.normalizer
        self.reg_max = reg_max
        self.static_assigner_epoch = static_assigner_epoch
        self.use_varifocal_loss = use_varifocal_loss
        self.loss_weight = _loss_weights(loss_weight)
        self.static_assigner = ATSSAssigner(
            num_classes=num_classes, **_assigner_kwargs(static_assigner, _DEFAULT_STATIC, "static_assigner")
        )
        self.assigner = TaskAlignedAssigner(
            num_classes=num_classes, **_assigner_kwargs(assigner, _DEFAULT_DYNAMIC, "assigner")
        )

    def _ground_truth(
        self, batch: Mapping[str, Any], batch_size: int, device: torch.device
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        for key in ("gt_class", "gt_bbox"):
            if key not in batch:
                raise KeyError(f"PPYOLOELoss needs batch[{key!r}]; the batch has {sorted(batch)}")
        gt_bbox = torch.as_tensor(batch["gt_bbox"], device=device).float()
        gt_bbox = gt_bbox.reshape(batch_size, 0 if gt_bbox.numel() == 0 else -1, 4)
        num_gts = gt_bbox.shape[1]
        gt_class = torch.as_tensor(batch["gt_class"], device=device).long().reshape(batch_size, num_gts, 1)
        if batch.get("pad_gt_mask") is not None:
            pad = torch.as_tensor(batch["pad_gt_mask"], device=device).float().reshape(batch_size, num_gts, 1)
        else:
            pad = (gt_bbox.sum(dim=-1, keepdim=True) > 0).float()
        return gt_class, gt_bbox, pad

    @full_precision
    def forward(self, preds: Mapping[str, Any], batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        cls_logits = preds["cls_logits"].float()
        reg_distri = preds["reg_distri"].float()
        batch_size, num_anchors, num_classes = cls_logits.shape
        bins = self.reg_max + 1
        if num_classes != self.num_classes:
            raise ValueError(
                f"cls_logits has {num_classes} classes, PPYOLOELoss num_classes is {self.num_classes}"
            )
        if tuple(reg_distri.shape) != (batch_size, num_anchors, 4 * bins):
            raise ValueError(
                f"reg_distri must be [B, A, 4*(reg_max+1)] = {[batch_size, num_anchors, 4 * bins]}, "
                f"got {list(reg_distri.shape)}"
            )
        device = cls_logits.device
        anchors = preds["anchors"].float()
        anchor_points = preds["anchor_points"].float()
        stride = preds["stride_tensor"].float().reshape(num_anchors, 1)
        num_anchors_list = [int(n) for n in preds["num_anchors_list"]]
        if "epoch_id" not in batch:
            raise KeyError("PPYOLOELoss needs batch['epoch_id'] (0-based) to choose ATSS or TAL")
        epoch_id = int(batch["epoch_id"])

        pred_dist = reg_distri.reshape(batch_size, num_anchors, 4, bins)
        proj = torch.arange(bins, device=device, dtype=torch.float32)
        points_s = anchor_points / stride
        pred_bboxes = distance2bbox(points_s, pred_dist.softmax(dim=-1) @ proj)  # stride units
        gt_labels, gt_bboxes, pad_gt_mask = self._ground_truth(batch, batch_size, device)

        pred_pixels = pred_bboxes.detach() * stride
        if epoch_id < self.static_assigner_epoch:
            labels, boxes, scores = self.static_assigner(
                anchors,
                num_anchors_list,
                gt_labels,
                gt_bboxes,
                pad_gt_mask,
                bg_index=num_classes,
                pred_bboxes=pred_pixels,
            )
            focal_alpha = 0.25
        else:
            labels, boxes, scores = self.assigner(
                cls_logits.detach().sigmoid(),
                pred_pixels,
                anchor_points,
                num_anchors_list,
                gt_labels,
                gt_bboxes,
                pad_gt_mask,
                bg_index=num_classes,
            )
            focal_alpha = -1.0
        boxes = boxes / stride

        if self.use_varifocal_loss:
            one_hot = class_one_hot(labels, num_classes, num_classes).float()
            loss_cls = varifocal_loss(cls_logits, scores, one_hot)
        else:
            loss_cls = sigmoid_focal_loss(cls_logits, scores, alpha=focal_alpha)
        raw_norm = _global_normaliser(scores.sum())
        norm = raw_norm.clamp(min=self.normalizer_floor)
        loss_cls = loss_cls / norm
        loss_l1, loss_iou, loss_dfl = self._box_losses(
            pred_dist, pred_bboxes, points_s, labels, boxes, scores, norm
        )

        w = self.loss_weight
        total = w["class"] * loss_cls + w["iou"] * loss_iou + w["dfl"] * loss_dfl
        return {
            "loss": total,
            "loss_cls": loss_cls,
            "loss_iou": loss_iou,
            "loss_dfl": loss_dfl,
            "loss_l1": loss_l1,
            NORMALIZER_KEY: raw_norm,
        }

    def _box_losses(
        self,
        pred_dist: torch.Tensor,
        pred_bboxes: torch.Tensor,
        points_s: torch.Tensor,
        labels: torch.Tensor,
        boxes: torch.Tensor,
        scores: torch.Tensor,
        norm: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """L1 (mean), GIoU and DFL (score-weighted, / ``norm``) over positives, in stride units.

        Every anchor is computed and the positives are selected by ``torch.where`` (fixed shapes,
        no host read); the others get a harmless target (the detached prediction itself), so
        their zeroed terms have finite gradients."""
        positive = labels != self.num_classes  # [B, A]
        count = positive.sum().clamp(min=1).to(pred_bboxes.dtype)
        targets = torch.where(positive.unsqueeze(-1), boxes, pred_bboxes.detach())
        weight = scores.sum(dim=-1)
        zero = pred_bboxes.new_zeros(())
        loss_l1 = torch.where(positive.unsqueeze(-1), (pred_bboxes - targets).abs(), zero).sum() / (
            4.0 * count
        )
        loss_iou = torch.where(positive, giou_loss(pred_bboxes, targets) * weight, zero).sum() / norm
        distances = bbox2distance(points_s.expand_as(targets[..., :2]), targets, self.reg_max)
        loss_dfl = (
            torch.where(positive, distribution_focal_loss(pred_dist, distances) * weight, zero).sum() / norm
        )
        return loss_l1, loss_iou, loss_dfl
