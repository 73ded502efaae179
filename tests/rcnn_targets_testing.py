"""The Paddle targets fixture (tests/fixtures/faster_rcnn/targets.npz, by make_targets.py beside it)
and ppdist's RPN and RoI targets on it, with the fixture's settings (RPN 64, RoIs 32, 4 classes),
for the target and loss tests."""

import os
from typing import Any, Dict

import numpy as np
import torch

from ppdist.losses.rcnn_targets import bbox_assign, rpn_anchor_target

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "faster_rcnn", "targets.npz")


def load_targets_fixture() -> Dict[str, torch.Tensor]:
    with np.load(FIXTURE) as data:
        return {k: torch.from_numpy(np.asarray(v)) for k, v in data.items()}


def rpn_targets(
    fx: Dict[str, torch.Tensor], use_random: bool = False, **settings: Any
) -> Dict[str, torch.Tensor]:
    return rpn_anchor_target(
        fx["anchors"],
        fx["gt_bbox"],
        fx["gt_mask"],
        fx["is_crowd"],
        batch_size_per_im=64,
        use_random=use_random,
        **settings,
    )


def roi_targets(fx: Dict[str, torch.Tensor], use_random: bool = False) -> Dict[str, torch.Tensor]:
    return bbox_assign(
        fx["rois"],
        fx["rois_mask"],
        fx["gt_bbox"],
        fx["gt_class"],
        fx["gt_mask"],
        4,
        fx["is_crowd"],
        batch_size_per_im=32,
        use_random=use_random,
    )
