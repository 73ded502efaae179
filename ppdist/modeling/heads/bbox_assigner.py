"""BBoxAssigner: the RoIs Faster R-CNN's box head trains on (PaddleDetection's ``BBoxAssigner`` /
``generate_proposal_target``, in fixed shapes): the ground-truth boxes join the proposals, each
candidate is matched to its best ground truth (foreground at IoU >= ``fg_thresh``, background under
``bg_thresh``), and ``batch_size_per_im`` of them are sampled per image with at most
``fg_fraction`` foreground (``ops.sampling``: no host read).

``assigner(rois [B, N, 4], rois_mask [B, N], batch)`` with the batch's padded ``gt_bbox`` [B, G, 4],
``gt_class`` [B, G, 1] and ``pad_gt_mask`` [B, G, 1] returns ``rois`` / ``rois_mask`` [B, S(, 4)]
(the sample, padded), ``bbox_fg_mask`` [B, S], ``bbox_gt_class`` [B, S] and ``bbox_gt_boxes``
[B, S, 4] (the matched ground truth; the loss makes the class labels and box targets from them).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import torch
from torch import nn

from ppdist.ops.sampling import compact, ground_truth, match_boxes, sample_labels
from ppdist.registry import HEADS


@HEADS.register
class BBoxAssigner(nn.Module):
    """Samples the box head's training RoIs and matches them to the ground truth (module docs)."""

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
    ) -> None:
        super().__init__()
        if ignore_thresh > 0:
            raise ValueError("BBoxAssigner.ignore_thresh (crowd boxes) is not supported; leave it at -1")
        self.batch_size_per_im = int(batch_size_per_im)
        self.fg_fraction = float(fg_fraction)
        self.fg_thresh, self.bg_thresh = float(fg_thresh), float(bg_thresh)
        self.use_random = bool(use_random)
        self.num_classes = int(num_classes)

    def forward(
        self,
        rois: torch.Tensor,
        rois_mask: torch.Tensor,
        batch: Mapping[str, Any],
        generator: Optional[torch.Generator] = None,
    ) -> Dict[str, torch.Tensor]:
        gt = ground_truth(batch, rois)
        candidates = torch.cat([rois.float(), gt["boxes"]], dim=1)  # the ground truth joins the proposals
        valid = torch.cat([rois_mask.bool(), gt["valid"]], dim=1)
        matches, labels = match_boxes(
            candidates, valid, gt["boxes"], gt["valid"], self.fg_thresh, self.bg_thresh, False
        )
        fg, bg = sample_labels(labels, self.batch_size_per_im, self.fg_fraction, self.use_random, generator)
        index = compact(fg | bg, self.batch_size_per_im)
        picked = matches.gather(1, index)
        return {
            "rois": candidates.gather(1, index.unsqueeze(-1).expand(-1, -1, 4)),
            "rois_mask": (fg | bg).gather(1, index),
            "bbox_fg_mask": fg.gather(1, index),
            "bbox_gt_class": gt["classes"].gather(1, picked),
            "bbox_gt_boxes": gt["boxes"].gather(1, picked.unsqueeze(-1).expand(-1, -1, 4)),
        }
