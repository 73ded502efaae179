"""Shared pieces of the Faster R-CNN tests."""

from __future__ import annotations

import copy
from typing import Any, Dict

TINY_FASTER_RCNN: Dict[str, Any] = {
    "model_type": "det",
    "Backbone": {"name": "ResNet", "depth": 18, "freeze_at": -1},
    "Neck": {"name": "FPN", "out_channel": 16},
    "Head": {
        "name": "FasterRCNNHead",
        "rpn_head": {
            "name": "RPNHead",
            "anchor_generator": {
                "anchor_sizes": [[32], [64], [128], [256], [512]],
                "strides": [4, 8, 16, 32, 64],
            },
            "train_proposal": {"pre_nms_top_n": 200, "post_nms_top_n": 50, "topk_after_collect": True},
            "test_proposal": {"pre_nms_top_n": 100, "post_nms_top_n": 40},
        },
        "bbox_head": {
            "name": "BBoxHead",
            "head": {"name": "TwoFCHead", "out_channel": 32},
            "num_classes": 3,
            "bbox_assigner": {"name": "BBoxAssigner", "batch_size_per_im": 16, "num_classes": 3},
        },
    },
}


def tiny_faster_rcnn() -> Dict[str, Any]:
    """A ResNet-18 Faster R-CNN with a 16-channel FPN, 3 classes, few proposals (a fresh copy)."""
    return copy.deepcopy(TINY_FASTER_RCNN)
