"""FasterRCNNLoss: PaddleDetection's Faster R-CNN loss terms from the two heads' training outputs.

- ``loss_rpn_cls`` / ``loss_rpn_reg``: the RPN's anchors matched to the ground truth
  (``rpn_target_assign``: IoU >= ``positive_overlap`` foreground, < ``negative_overlap`` background,
  every ground truth's best anchors foreground), ``batch_size_per_im`` sampled per image with at most
  ``fg_fraction`` foreground; sigmoid cross entropy over the sample and L1 on the foreground's
  deltas (``bbox2delta``, unit weights), both summed and divided by ``batch_size_per_im`` x images.
- ``loss_bbox_cls`` / ``loss_bbox_reg``: softmax cross entropy over the sampled RoIs (background the
  last class), mean over them; L1 between the foreground's class-specific deltas and
  ``bbox2delta(roi, matched gt, bbox_weight)``, summed and divided by the sampled RoIs.

Fixed shapes and masks throughout: no host read (the sampling is ``ops.sampling``'s).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.ops.box_coder import bbox2delta
from ppdist.ops.sampling import ground_truth, match_boxes, sample_labels
from ppdist.registry import LOSSES

RPN_TARGET_ASSIGN = {
    "batch_size_per_im": 256,
    "fg_fraction": 0.5,
    "positive_overlap": 0.7,
    "negative_overlap": 0.3,
    "use_random": True,
}


@LOSSES.register
class FasterRCNNLoss(nn.Module):
    """The RPN's and the box head's loss terms (module docs); ``loss`` is their sum."""

    def __init__(
        self,
        rpn_target_assign: Optional[Mapping[str, Any]] = None,
        bbox_weight: Sequence[float] = (10.0, 10.0, 5.0, 5.0),
    ) -> None:
        super().__init__()
        settings = dict(RPN_TARGET_ASSIGN, **dict(rpn_target_assign or {}))
        unknown = sorted(set(settings) - set(RPN_TARGET_ASSIGN) - {"ignore_thresh", "assign_on_cpu"})
        if unknown:
            raise ValueError(f"FasterRCNNLoss.rpn_target_assign: unknown key(s) {unknown}")
        if float(settings.get("ignore_thresh", -1)) > 0:
            raise ValueError("rpn_target_assign.ignore_thresh (crowd boxes) is not supported; leave it at -1")
        self.rpn = {k: settings[k] for k in RPN_TARGET_ASSIGN}
        self.bbox_weight = [float(w) for w in bbox_weight]

    def forward(self, preds: Mapping[str, Any], batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        terms = {**self.rpn_loss(preds, batch), **self.bbox_loss(preds)}
        terms = {name: value.float() for name, value in terms.items()}
        return {"loss": sum(terms.values()), **terms}

    def rpn_loss(self, preds: Mapping[str, Any], batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        scores, deltas = preds["rpn_scores"].float(), preds["rpn_deltas"].float()
        anchors = preds["anchors"].float().expand(scores.shape[0], -1, -1)
        gt = ground_truth(batch, scores)
        valid = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
        rpn = self.rpn
        matches, labels = match_boxes(
            anchors, valid, gt["boxes"], gt["valid"], rpn["positive_overlap"], rpn["negative_overlap"], True
        )
        fg, bg = sample_labels(labels, rpn["batch_size_per_im"], rpn["fg_fraction"], rpn["use_random"])
        norm = float(rpn["batch_size_per_im"] * scores.shape[0])
        sampled = (fg | bg).float()
        cls = F.binary_cross_entropy_with_logits(scores, fg.float(), reduction="none")
        matched = gt["boxes"].gather(1, matches.unsqueeze(-1).expand(-1, -1, 4))
        target = torch.where(fg.unsqueeze(-1), bbox2delta(anchors, matched), torch.zeros_like(deltas))
        reg = torch.where(fg.unsqueeze(-1), (deltas - target).abs(), torch.zeros_like(deltas))
        return {"loss_rpn_cls": (cls * sampled).sum() / norm, "loss_rpn_reg": reg.sum() / norm}

    def bbox_loss(self, preds: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        logits, deltas = preds["bbox_score"].float(), preds["bbox_delta"].float()
        sampled, fg = preds["rois_mask"].bool(), preds["bbox_fg_mask"].bool()
        num_classes = logits.shape[-1] - 1
        labels = torch.where(fg, preds["bbox_gt_class"], torch.full_like(preds["bbox_gt_class"], num_classes))
        count = sampled.sum().clamp(min=1).float()
        cls = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)
        per_class = deltas.view(*deltas.shape[:2], num_classes, 4)
        chosen = per_class.gather(2, labels.clamp(max=num_classes - 1)[..., None, None].expand(-1, -1, 1, 4))
        target = bbox2delta(preds["rois"].float(), preds["bbox_gt_boxes"].float(), self.bbox_weight)
        target = torch.where(fg.unsqueeze(-1), target, torch.zeros_like(target))
        reg = torch.where(fg.unsqueeze(-1), (chosen.squeeze(2) - target).abs(), torch.zeros_like(target))
        return {
            "loss_bbox_cls": torch.where(sampled, cls, torch.zeros_like(cls)).sum() / count,
            "loss_bbox_reg": reg.sum() / count,
        }
