"""Faster R-CNN losses (issue 43): the RPN loss and the BBoxHead loss as PaddleDetection's
``RPNHead.get_loss`` / ``BBoxHead.get_loss`` compute them, in fixed shapes on masks.

RPN: sigmoid cross entropy summed over the sampled anchors and L1 summed over the positive
deltas, both divided by ``batch_size_per_im * B``. BBoxHead: softmax cross entropy averaged
over the sampled RoIs of the batch; L1 on the class-specific deltas of the foreground RoIs
summed and divided by the number of sampled RoIs. Nothing reads a tensor value on the host.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.errors import DataError
from ppdist.losses.rcnn_targets import rpn_anchor_target
from ppdist.ops.box_coder import bbox2delta
from ppdist.registry import LOSSES


def rpn_loss(
    rpn_scores: torch.Tensor, rpn_deltas: torch.Tensor, targets: Dict[str, torch.Tensor]
) -> Dict[str, torch.Tensor]:
    """``rpn_scores`` [B, A] logits, ``rpn_deltas`` [B, A, 4], ``targets`` from
    ``rpn_anchor_target`` -> ``{"loss_rpn_cls", "loss_rpn_reg"}`` (0-d)."""
    labels = targets["labels"]
    norm = targets["norm"]
    sampled = (labels >= 0).to(rpn_scores.dtype)
    bce = F.binary_cross_entropy_with_logits(
        rpn_scores.float(), labels.clamp(min=0).float(), reduction="none"
    )
    pos = (labels == 1).unsqueeze(-1)
    # targets of unused anchors (a padded gt, log 0) stay out of the values and the gradients
    target = torch.where(pos, targets["deltas"].detach(), 0.0)
    l1 = torch.where(pos, (rpn_deltas.float() - target).abs(), 0.0)
    return {"loss_rpn_cls": (bce * sampled).sum() / norm, "loss_rpn_reg": l1.sum() / norm}


def bbox_head_loss(
    bbox_score: torch.Tensor,
    bbox_delta: torch.Tensor,
    targets: Dict[str, torch.Tensor],
    num_classes: int,
    bbox_weight: Sequence[float] = (10.0, 10.0, 5.0, 5.0),
) -> Dict[str, torch.Tensor]:
    """``bbox_score`` [B, S, C + 1] logits (background last), ``bbox_delta`` [B, S, 4 * C] (or
    [B, S, 4] class-agnostic), ``targets`` from ``bbox_assign`` -> ``{"loss_bbox_cls",
    "loss_bbox_reg"}`` (0-d)."""
    labels = targets["tgt_labels"]
    valid = labels >= 0
    count = valid.sum().clamp(min=1).float()
    ce = F.cross_entropy(bbox_score.float().flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none")
    loss_cls = (ce * valid.flatten().float()).sum() / count
    fg = valid & (labels < num_classes)
    deltas = bbox_delta.float().reshape(*bbox_delta.shape[:2], -1, 4)
    if deltas.shape[2] > 1:
        col = labels.clamp(0, num_classes - 1)[..., None, None].expand(-1, -1, 1, 4)
        deltas = deltas.gather(2, col)
    deltas = deltas.squeeze(2)
    fg4 = fg.unsqueeze(-1)
    reg_target = torch.where(
        fg4, bbox2delta(targets["rois"], targets["tgt_bboxes"], bbox_weight).detach(), 0.0
    )
    l1 = torch.where(fg4, (deltas - reg_target).abs(), 0.0)
    return {"loss_bbox_cls": loss_cls, "loss_bbox_reg": l1.sum() / count}


def _gt(batch: Mapping[str, Any]) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The padded ground truth of a det batch: boxes, validity mask, crowd flags."""
    for key in ("gt_bbox", "gt_class"):
        if key not in batch:
            raise DataError(f"FasterRCNNLoss: the batch has no {key!r} (padded gt expected)")
    boxes = batch["gt_bbox"]
    mask = batch.get("pad_gt_mask")
    if mask is None:
        mask = torch.ones(boxes.shape[:2], dtype=torch.bool, device=boxes.device)
    return boxes, mask.reshape(boxes.shape[:2]) > 0, batch.get("is_crowd")


@LOSSES.register
class FasterRCNNLoss(nn.Module):
    """The Faster R-CNN training loss on ``FasterRCNNHead``'s flat training output: RPN targets
    from ``anchors`` and the batch's padded gt, the RPN loss on ``rpn_scores`` / ``rpn_deltas``,
    and the BBoxHead loss on ``bbox_score`` / ``bbox_delta`` against the sampler's ``rois``,
    ``tgt_labels``, ``tgt_bboxes``.

    ``rpn_target_assign``: PaddleDetection's ``RPNTargetAssign`` keywords (its defaults when
    absent); ``num_classes`` defaults to ``bbox_score``'s width - 1. Returns ``{"loss",
    "loss_rpn_cls", "loss_rpn_reg", "loss_bbox_cls", "loss_bbox_reg"}`` (the total is their sum)."""

    def __init__(
        self,
        num_classes: Optional[int] = None,
        rpn_target_assign: Optional[Mapping[str, Any]] = None,
        bbox_weight: Sequence[float] = (10.0, 10.0, 5.0, 5.0),
    ) -> None:
        super().__init__()
        self.num_classes = None if num_classes is None else int(num_classes)
        self.rpn_target_assign = dict(rpn_target_assign or {})
        self.rpn_target_assign.pop("name", None)
        self.rpn_target_assign.pop("assign_on_cpu", None)
        self.bbox_weight = [float(w) for w in bbox_weight]

    def rpn_terms(self, preds: Mapping[str, Any], batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        """``{"loss_rpn_cls", "loss_rpn_reg"}``: the RPN's anchor targets and loss."""
        gt_bbox, gt_mask, is_crowd = _gt(batch)
        with torch.no_grad():
            targets = rpn_anchor_target(
                preds["anchors"], gt_bbox, gt_mask, is_crowd, **self.rpn_target_assign
            )
        return rpn_loss(preds["rpn_scores"], preds["rpn_deltas"], targets)

    def forward(self, preds: Mapping[str, Any], batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        out = self.rpn_terms(preds, batch)
        num_classes = self.num_classes or preds["bbox_score"].shape[-1] - 1
        out.update(
            bbox_head_loss(preds["bbox_score"], preds["bbox_delta"], preds, num_classes, self.bbox_weight)
        )
        out["loss"] = out["loss_rpn_cls"] + out["loss_rpn_reg"] + out["loss_bbox_cls"] + out["loss_bbox_reg"]
        return out
