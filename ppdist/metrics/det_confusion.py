"""The detection confusion matrix: each prediction matched to at most one ground-truth box."""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of xyxy boxes ``a [N, 4]`` and ``b [M, 4]``."""
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clip(0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clip(0).prod(-1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-12)


def detection_confusion(
    ground_truth: Dict[int, Tuple[np.ndarray, np.ndarray]],
    detections: Dict[int, Tuple[np.ndarray, np.ndarray, np.ndarray]],
    num_classes: int,
    iou_threshold: float = 0.5,
    score_threshold: float = 0.25,
) -> np.ndarray:
    """``[K + 1, K + 1]`` counts, rows the ground-truth class (last: background), columns the
    predicted class (last: background). Per image, the predictions at or above
    ``score_threshold`` in descending score each take the unmatched ground-truth box of highest
    IoU >= ``iou_threshold`` (any class); unmatched predictions count as background rows,
    unmatched ground truth as background columns. The total is the ground-truth boxes plus the
    unmatched predictions. ``ground_truth[image] = (boxes xyxy, classes)``,
    ``detections[image] = (boxes xyxy, classes, scores)``."""
    matrix = np.zeros((num_classes + 1, num_classes + 1), dtype=np.int64)
    for image in set(ground_truth) | set(detections):
        gt_boxes, gt_classes = ground_truth.get(image, (np.zeros((0, 4)), np.zeros(0, int)))
        boxes, classes, scores = detections.get(image, (np.zeros((0, 4)), np.zeros(0, int), np.zeros(0)))
        keep = scores >= score_threshold
        boxes, classes, scores = boxes[keep], classes[keep], scores[keep]
        order = np.argsort(-scores, kind="stable")
        ious = box_iou(boxes[order], gt_boxes)
        taken = np.zeros(len(gt_boxes), bool)
        for row, index in enumerate(order):
            candidates = np.where(~taken & (ious[row] >= iou_threshold), ious[row], -1.0)
            best = int(candidates.argmax()) if len(candidates) else -1
            if best >= 0 and candidates[best] >= 0:
                taken[best] = True
                matrix[int(gt_classes[best]), int(classes[index])] += 1
            else:
                matrix[num_classes, int(classes[index])] += 1
        for cls in gt_classes[~taken]:
            matrix[int(cls), num_classes] += 1
    return matrix
