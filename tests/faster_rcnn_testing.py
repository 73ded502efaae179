"""Shared pieces of the Faster R-CNN tests."""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Tuple

import numpy as np
import torch
import yaml

# PaddleDetection release/2.7.1's configs/faster_rcnn, copied unchanged
RELEASE_CONFIGS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "fixtures",
    "paddle_configs",
    "PaddleDetection",
    "configs",
    "faster_rcnn",
)
# the seed's recipe (Faster R-CNN R50-vd FPN 1x)
R50_VD_FPN = os.path.join(RELEASE_CONFIGS, "faster_rcnn_r50_vd_fpn_1x_coco.yml")
# PaddleDetection release/2.7.1's configs/cascade_rcnn, copied unchanged
CASCADE_CONFIGS = os.path.join(os.path.dirname(RELEASE_CONFIGS), "cascade_rcnn")
CASCADE_R50_FPN = os.path.join(CASCADE_CONFIGS, "cascade_rcnn_r50_fpn_1x_coco.yml")

# the RPN fixture's settings (fixtures/faster_rcnn/make_rpn.py, tests/modeling/heads/test_rpn_head.py)
RPN_STRIDES = [4, 8, 16, 32, 64]
RPN_ANCHORS = {
    "aspect_ratios": [0.5, 1.0, 2.0],
    "anchor_sizes": [[32], [64], [128], [256], [512]],
    "strides": RPN_STRIDES,
}
RPN_TRAIN = {
    "min_size": 0.0,
    "nms_thresh": 0.7,
    "pre_nms_top_n": 120,
    "post_nms_top_n": 80,
    "topk_after_collect": True,
}
RPN_TEST = {"min_size": 0.0, "nms_thresh": 0.7, "pre_nms_top_n": 100, "post_nms_top_n": 60}

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


def tiny_cascade_rcnn() -> Dict[str, Any]:
    """``tiny_faster_rcnn`` with Cascade R-CNN's box head (three stages of a 32-wide
    CascadeTwoFCHead, PaddleDetection's default stage settings)."""
    model = tiny_faster_rcnn()
    model["Head"]["bbox_head"] = {
        "name": "CascadeHead",
        "head": {"name": "CascadeTwoFCHead", "out_channel": 32},
        "num_classes": 3,
        "bbox_assigner": {"name": "BBoxAssigner", "batch_size_per_im": 16, "num_classes": 3},
    }
    return model


def tiny_faster_rcnn_config(path: str, data_dir: str, save_dir: str, cascade: bool = False) -> str:
    """A config file of ``tiny_faster_rcnn`` (``tiny_cascade_rcnn`` with ``cascade``) with its
    post-process and a 128x160 Eval resize (what export reads; no data set: ``data_dir`` is where
    its annotations would be)."""
    model = tiny_cascade_rcnn() if cascade else tiny_faster_rcnn()
    decode = {
        "name": "RCNNBox",
        "prior_box_var": [30.0, 30.0, 15.0, 15.0] if cascade else [10.0, 10.0, 5.0, 5.0],
    }
    config = {
        "Global": {"num_classes": 3, "epoch_num": 1, "save_model_dir": save_dir, "use_gpu": False},
        "Architecture": dict(model, algorithm="CascadeRCNN" if cascade else "FasterRCNN"),
        "Loss": {"name": "CascadeRCNNLoss" if cascade else "FasterRCNNLoss"},
        "Optimizer": {"name": "Momentum", "momentum": 0.9, "lr": {"name": "Piecewise", "values": [0.01]}},
        "Metric": {"name": "COCOMetric"},
        "PostProcess": {
            "name": "BBoxPostProcess",
            "num_classes": 3,
            "decode": decode,
            "nms": {"score_threshold": 0.05, "keep_top_k": 100, "nms_threshold": 0.5},
        },
        "Eval": {
            "dataset": {
                "name": "COCODataSet",
                "dataset_dir": data_dir,
                "image_dir": "images/val",
                "anno_path": "annotations/instances_val.json",
                "transforms": [
                    {"Decode": {}},
                    {"Resize": {"target_size": [128, 160], "keep_ratio": False, "interp": 2}},
                    {"NormalizeImage": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}},
                    {"Permute": {}},
                ],
            },
            "loader": {"batch_size_per_card": 2},
        },
    }
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    return path


def same_detections(results: List[Dict[str, Any]], bbox: Any, bbox_num: Any) -> Tuple[float, float]:
    """``BBoxPostProcess`` results equal PaddleDetection's ``bbox`` [M, 6] / ``bbox_num`` [B]
    (rows ordered by label, then score): counts and labels exact, scores within 1e-5, boxes within
    1e-3 px. Returns the largest score and box differences."""

    def by_label_then_score(rows):
        return rows[np.lexsort((-rows[:, 1], rows[:, 0]))]

    counts = [int(n) for n in bbox_num]
    assert [len(r["boxes"]) for r in results] == counts
    worst = np.zeros(2)
    for mine, theirs in zip(results, np.split(bbox, np.cumsum(counts)[:-1])):
        rows = torch.cat(
            [mine["labels"][:, None].float(), mine["scores"][:, None], mine["boxes"]], dim=1
        ).numpy()
        rows, theirs = by_label_then_score(rows), by_label_then_score(theirs)
        np.testing.assert_array_equal(rows[:, 0], theirs[:, 0])
        np.testing.assert_allclose(rows[:, 1], theirs[:, 1], atol=1e-5, rtol=0)
        np.testing.assert_allclose(rows[:, 2:], theirs[:, 2:], atol=1e-3, rtol=0)
        worst = np.maximum(
            worst, [np.abs(rows[:, 1] - theirs[:, 1]).max(), np.abs(rows[:, 2:] - theirs[:, 2:]).max()]
        )
    return float(worst[0]), float(worst[1])
