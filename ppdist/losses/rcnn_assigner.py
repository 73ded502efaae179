"""``BBoxAssigner`` (issue 43): Faster R-CNN's proposal sampler as the registered part that
``FasterRCNNHead`` calls between its two stages, ``assigner(rois, rois_mask, batch)``; it wraps
``rcnn_targets.bbox_assign`` with PaddleDetection's keyword names and defaults. Cascade R-CNN's
later stages label their refined boxes with ``assigner.cascade_stage(rois, rois_mask, batch,
stage)`` (``rcnn_targets.cascade_assign`` at ``cascade_iou[stage]``)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from ppdist.errors import DataError
from ppdist.losses.rcnn_targets import bbox_assign, cascade_assign
from ppdist.registry import HEADS


@HEADS.register
class BBoxAssigner(nn.Module):
    """Samples ``batch_size_per_im`` RoIs per image (``fg_fraction`` foreground at IoU >=
    ``fg_thresh``, background below ``bg_thresh``, the valid gt appended as proposals).

    ``forward(rois [B, N, 4], rois_mask [B, N], batch)`` reads the batch's padded ``gt_bbox``,
    ``gt_class``, ``pad_gt_mask`` (all rows valid without it) and ``is_crowd``, and returns
    ``{"rois", "rois_mask", "tgt_labels", "tgt_bboxes", "tgt_gt_inds"}`` ([B, S, ...])."""

    def __init__(
        self,
        batch_size_per_im: int = 512,
        fg_fraction: float = 0.25,
        fg_thresh: float = 0.5,
        bg_thresh: float = 0.5,
        ignore_thresh: float = -1.0,
        use_random: bool = True,
        cascade_iou: Sequence[float] = (0.5, 0.6, 0.7),
        num_classes: int = 80,
        assign_on_cpu: bool = False,
    ) -> None:
        super().__init__()
        self.batch_size_per_im = int(batch_size_per_im)
        self.fg_fraction = float(fg_fraction)
        self.fg_thresh = float(fg_thresh)
        self.bg_thresh = float(bg_thresh)
        self.ignore_thresh = float(ignore_thresh)
        self.use_random = bool(use_random)
        self.cascade_iou = [float(v) for v in cascade_iou]  # Cascade R-CNN's later stages
        self.num_classes = int(num_classes)

    def forward(
        self, rois: torch.Tensor, rois_mask: torch.Tensor, batch: Mapping[str, Any]
    ) -> Dict[str, torch.Tensor]:
        gt_bbox, gt_class, gt_mask, crowd = _ground_truth(batch, rois.device)
        with torch.no_grad():
            return bbox_assign(
                rois,
                rois_mask,
                gt_bbox,
                gt_class,
                gt_mask,
                self.num_classes,
                crowd,
                batch_size_per_im=self.batch_size_per_im,
                fg_fraction=self.fg_fraction,
                fg_thresh=self.fg_thresh,
                bg_thresh=self.bg_thresh,
                ignore_thresh=self.ignore_thresh,
                use_random=self.use_random,
            )

    def cascade_stage(
        self, rois: torch.Tensor, rois_mask: torch.Tensor, batch: Mapping[str, Any], stage: int
    ) -> Dict[str, torch.Tensor]:
        """Targets of Cascade R-CNN's stage ``stage`` (>= 1): every valid refined box, labelled at
        ``cascade_iou[stage]`` (foreground and background threshold alike), none sampled."""
        if not 0 < stage < len(self.cascade_iou):
            raise ValueError(
                f"BBoxAssigner: cascade stage {stage} has no cascade_iou (cascade_iou={self.cascade_iou})"
            )
        gt_bbox, gt_class, gt_mask, crowd = _ground_truth(batch, rois.device)
        with torch.no_grad():
            return cascade_assign(
                rois,
                rois_mask,
                gt_bbox,
                gt_class,
                gt_mask,
                self.num_classes,
                self.cascade_iou[stage],
                crowd,
                self.ignore_thresh,
            )


def _ground_truth(
    batch: Mapping[str, Any], device: torch.device
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The batch's padded ``gt_bbox`` [B, G, 4], ``gt_class``, validity mask [B, G] (bool; every
    row valid without ``pad_gt_mask``) and ``is_crowd`` (or None), on ``device``."""
    for key in ("gt_bbox", "gt_class"):
        if key not in batch:
            raise DataError(f"BBoxAssigner: the batch has no {key!r} (padded ground truth expected)")
    gt_bbox = torch.as_tensor(batch["gt_bbox"], device=device).float()
    gt_class = torch.as_tensor(batch["gt_class"], device=device)
    mask = batch.get("pad_gt_mask")
    mask = torch.ones(gt_bbox.shape[:2], device=device) if mask is None else torch.as_tensor(mask)
    crowd = batch.get("is_crowd")
    crowd = None if crowd is None else torch.as_tensor(crowd, device=device)
    return gt_bbox, gt_class, mask.to(device).reshape(gt_bbox.shape[:2]) > 0, crowd
