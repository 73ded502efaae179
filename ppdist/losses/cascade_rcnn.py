"""Cascade R-CNN's loss: PaddleDetection's ``CascadeHead.get_loss`` on ``CascadeHead``'s output.

The RPN terms are Faster R-CNN's (``FasterRCNNLoss.rpn_terms``); then each stage's box terms
(``bbox_head_loss``: softmax cross entropy over the stage's RoIs, L1 on the foreground's deltas
encoded with the stage's ``bbox_weight``), multiplied by the stage's ``stage_loss_weights`` entry
(1 / stages each by default, as PaddleDetection) and named ``loss_bbox_cls_stage<i>`` /
``loss_bbox_reg_stage<i>``; ``loss`` is their sum with the RPN's. Stage 0's targets are the
sampler's (``tgt_labels``, ``tgt_bboxes``), the later stages' the head's ``tgt_*_stage<i>``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import torch

from ppdist.losses.faster_rcnn import FasterRCNNLoss, bbox_head_loss
from ppdist.ops.box_coder import CASCADE_BBOX_WEIGHTS
from ppdist.registry import LOSSES


@LOSSES.register
class CascadeRCNNLoss(FasterRCNNLoss):
    """The RPN loss and every cascade stage's weighted box loss (module docs); ``bbox_weight`` has
    one ``[wx, wy, ww, wh]`` per stage, ``stage_loss_weights`` one factor per stage."""

    def __init__(
        self,
        num_classes: Optional[int] = None,
        rpn_target_assign: Optional[Mapping[str, Any]] = None,
        bbox_weight: Sequence[Sequence[float]] = CASCADE_BBOX_WEIGHTS,
        stage_loss_weights: Optional[Sequence[float]] = None,
    ) -> None:
        super().__init__(num_classes, rpn_target_assign)
        self.stage_bbox_weight = [[float(v) for v in w] for w in bbox_weight]
        stages = len(self.stage_bbox_weight)
        weights = (
            [1.0 / stages] * stages if stage_loss_weights is None else [float(w) for w in stage_loss_weights]
        )
        if len(weights) != stages:
            raise ValueError(
                f"CascadeRCNNLoss: stage_loss_weights has {len(weights)} entries for {stages} stages (bbox_weight)"
            )
        self.stage_loss_weights = weights

    def forward(self, preds: Mapping[str, Any], batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        out = self.rpn_terms(preds, batch)
        num_classes = self.num_classes or preds["bbox_score_stage0"].shape[-1] - 1
        for stage, (factor, box_weight) in enumerate(zip(self.stage_loss_weights, self.stage_bbox_weight)):
            suffix = f"_stage{stage}" if stage else ""
            targets = {
                "rois": preds[f"rois_stage{stage}"],
                "tgt_labels": preds["tgt_labels" + suffix],
                "tgt_bboxes": preds["tgt_bboxes" + suffix],
            }
            terms = bbox_head_loss(
                preds[f"bbox_score_stage{stage}"],
                preds[f"bbox_delta_stage{stage}"],
                targets,
                num_classes,
                box_weight,
            )
            out.update({f"{name}_stage{stage}": value * factor for name, value in terms.items()})
        out["loss"] = torch.stack(list(out.values())).sum()
        return out
