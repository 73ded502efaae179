"""Cascade R-CNN's box head (PaddleDetection's ``CascadeHead`` with ``CascadeTwoFCHead``): the
second stage of Faster R-CNN repeated ``num_cascade_stages`` times, each stage pooling the boxes
the previous one refined.

``CascadeHead`` is the ``bbox_head`` entry of ``FasterRCNNHead`` (no family branch anywhere): it
is called as every box head, ``forward(feats, rois, rois_mask, im_shape, resample)``. Stage 0
takes the RPN's proposals (in training the ones ``BBoxAssigner`` sampled); stage ``i > 0`` takes
stage ``i - 1``'s boxes decoded with ``bbox_weight[i - 1]`` and clipped to the image, and in
training drops the empty ones (a mask, not a gather) and labels the rest with ``resample(rois,
rois_mask, i)`` (``BBoxAssigner.cascade_stage``: ``cascade_iou[i]``, no sampling). Parameter names
are PaddleDetection's: ``head.<stage>.fc6`` / ``fc7``, ``bbox_score_stage<i>``, ``bbox_delta_stage<i>``.

Output: what ``BBoxPostProcess`` reads - ``bbox_prob`` (the mean of the stages' softmax),
``bbox_delta`` and ``rois`` / ``rois_mask`` of the last stage, ``bbox_score`` its logits - and,
per stage, ``bbox_score_stage<i>``, ``bbox_delta_stage<i>``, ``rois_stage<i>``,
``rois_mask_stage<i>`` with, in training, the targets of the later stages
(``tgt_labels_stage<i>``, ``tgt_bboxes_stage<i>``; stage 0's are the sampler's ``tgt_labels`` /
``tgt_bboxes``) for ``CascadeRCNNLoss``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ppdist.modeling.heads.bbox_head import TwoFCHead, build_roi_extractor, normal_linear
from ppdist.ops.box_coder import CASCADE_BBOX_WEIGHTS, clip_to_shape, delta2bbox
from ppdist.registry import HEADS

Resample = Callable[[torch.Tensor, torch.Tensor, int], Dict[str, torch.Tensor]]


@HEADS.register
class CascadeTwoFCHead(nn.Module):
    """One ``TwoFCHead`` per stage (sub-modules ``"0"``, ``"1"``, ...); ``forward(feat, stage)``."""

    def __init__(
        self, in_channel: int = 256, out_channel: int = 1024, resolution: int = 7, num_cascade_stage: int = 3
    ) -> None:
        super().__init__()
        self.out_channels = out_channel
        for stage in range(int(num_cascade_stage)):
            self.add_module(str(stage), TwoFCHead(in_channel, out_channel, resolution))

    def forward(self, rois_feat: torch.Tensor, stage: int = 0) -> torch.Tensor:
        return self._modules[str(stage)](rois_feat)


def _nonempty(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])


@HEADS.register
class CascadeHead(nn.Module):
    """Cascade R-CNN's stages (module docs); PaddleDetection's keywords and defaults. Refused in one
    line: ``bbox_loss`` (the box loss is L1), ``loss_normalize_pos``, and ``add_gt_as_proposals``
    other than ground truth appended at stage 0 only (the sampler's rule)."""

    def __init__(
        self,
        head: Union[Mapping[str, Any], nn.Module, str] = "CascadeTwoFCHead",
        in_channel: Optional[int] = None,
        roi_extractor: Optional[Mapping[str, Any]] = None,
        bbox_assigner: Union[Mapping[str, Any], str, None] = "BBoxAssigner",
        num_classes: int = 80,
        bbox_weight: Sequence[Sequence[float]] = CASCADE_BBOX_WEIGHTS,
        num_cascade_stages: int = 3,
        bbox_loss: Optional[Mapping[str, Any]] = None,
        reg_class_agnostic: bool = True,
        stage_loss_weights: Optional[Sequence[float]] = None,
        loss_normalize_pos: bool = False,
        add_gt_as_proposals: Sequence[bool] = (True, False, False),
        feat_channel: int = 256,
        feat_strides: Sequence[float] = (4, 8, 16, 32, 64),
    ) -> None:
        super().__init__()
        stages = int(num_cascade_stages)
        _check_settings(
            stages, bbox_weight, stage_loss_weights, add_gt_as_proposals, bbox_loss, loss_normalize_pos
        )
        self.roi_extractor = build_roi_extractor(roi_extractor, feat_strides, "CascadeHead.roi_extractor")
        if isinstance(head, nn.Module):
            self.head = head
        else:
            cfg = {"name": head} if isinstance(head, str) else dict(head)
            cfg.setdefault("in_channel", feat_channel)
            cfg.setdefault("resolution", self.roi_extractor.resolution)
            cfg.setdefault("num_cascade_stage", stages)
            self.head = HEADS.build(cfg, where="Architecture.Head.bbox_head.head")
        width = int(in_channel or self.head.out_channels)
        self.bbox_assigner = bbox_assigner
        self.num_classes = int(num_classes)
        self.num_cascade_stages = stages
        self.bbox_weight = [[float(v) for v in w] for w in bbox_weight[:stages]]
        self.stage_loss_weights = (
            [1.0 / stages] * stages if stage_loss_weights is None else list(stage_loss_weights)
        )
        self.reg_class_agnostic = bool(reg_class_agnostic)
        self.out_channels = self.num_classes
        deltas = 4 if self.reg_class_agnostic else 4 * self.num_classes
        for stage in range(stages):
            self.add_module(
                f"bbox_score_stage{stage}", normal_linear(nn.Linear(width, self.num_classes + 1), 0.01)
            )
            self.add_module(f"bbox_delta_stage{stage}", normal_linear(nn.Linear(width, deltas), 0.001))

    def forward(
        self,
        feats: Sequence[torch.Tensor],
        rois: torch.Tensor,
        rois_mask: torch.Tensor,
        im_shape: Optional[torch.Tensor] = None,
        resample: Optional[Resample] = None,
    ) -> Dict[str, torch.Tensor]:
        if im_shape is None:
            raise ValueError("CascadeHead: needs each image's im_shape to clip the refined boxes")
        if self.training and resample is None:
            raise ValueError("CascadeHead: training needs the sampler's cascade_stage for the later stages")
        batch, count = rois.shape[:2]
        out: Dict[str, torch.Tensor] = {}
        probs = []
        refined = rois  # the boxes the next stage pools (stage 0: the proposals as given)
        for stage in range(self.num_cascade_stages):
            if stage > 0:
                rois = clip_to_shape(refined, im_shape.to(refined.dtype)[:, None, :]).detach()
                if self.training:
                    rois_mask = rois_mask & _nonempty(rois)
                    targets = resample(rois, rois_mask, stage)
                    rois_mask = targets["rois_mask"]
                    out[f"tgt_labels_stage{stage}"] = targets["tgt_labels"]
                    out[f"tgt_bboxes_stage{stage}"] = targets["tgt_bboxes"]
            feat = self.head(self.roi_extractor(feats, rois), stage)
            scores = self._modules[f"bbox_score_stage{stage}"](feat).reshape(batch, count, -1)
            deltas = self._modules[f"bbox_delta_stage{stage}"](feat).reshape(batch, count, -1)
            last = stage == self.num_cascade_stages - 1
            if not self.reg_class_agnostic and not last:  # the predicted class's deltas refine the box
                best = scores[..., :-1].argmax(-1)[..., None, None].expand(-1, -1, 1, 4)
                deltas = deltas.reshape(batch, count, -1, 4).gather(2, best).squeeze(2)
            out[f"bbox_score_stage{stage}"], out[f"bbox_delta_stage{stage}"] = scores, deltas
            out[f"rois_stage{stage}"], out[f"rois_mask_stage{stage}"] = rois, rois_mask
            probs.append(torch.softmax(scores.float(), dim=-1))
            if not last:
                # in the RoIs' precision (float32 under autocast)
                refined = delta2bbox(deltas.detach().to(rois.dtype), rois, self.bbox_weight[stage]).squeeze(
                    -2
                )
        out.update(
            {
                "bbox_score": scores,
                "bbox_delta": deltas,
                "bbox_prob": torch.stack(probs).sum(0) / self.num_cascade_stages,
                "rois": rois,
                "rois_mask": rois_mask,
            }
        )
        return out


def _check_settings(
    stages: int,
    bbox_weight: Sequence[Sequence[float]],
    stage_loss_weights: Optional[Sequence[float]],
    add_gt_as_proposals: Sequence[bool],
    bbox_loss: Optional[Mapping[str, Any]],
    loss_normalize_pos: bool,
) -> None:
    """The settings ppdist reproduces, each other value refused in one line."""
    if len(bbox_weight) < stages:  # PaddleDetection reads the first ``stages`` entries
        raise ValueError(f"CascadeHead: bbox_weight has {len(bbox_weight)} entries for {stages} stages")
    if stage_loss_weights is not None and len(stage_loss_weights) != stages:
        raise ValueError(
            f"CascadeHead: stage_loss_weights has {len(stage_loss_weights)} entries for {stages} stages"
        )
    if [bool(v) for v in add_gt_as_proposals][:stages] != [True] + [False] * (stages - 1):
        raise ValueError(
            f"CascadeHead: add_gt_as_proposals {list(add_gt_as_proposals)} is not supported: the ground "
            f"truth joins the proposals at stage 0 only ({[True] + [False] * (stages - 1)})"
        )
    if bbox_loss is not None:
        raise ValueError(
            "CascadeHead: bbox_loss is not supported (the box loss is L1, PaddleDetection's default)"
        )
    if loss_normalize_pos:
        raise ValueError(
            "CascadeHead: loss_normalize_pos true is not supported (the loss is over the sampled RoIs)"
        )
