"""Semantic-segmentation metrics from per-class pixel areas (PaddleSeg's formulas).

For each class ``i`` over non-ignored pixels: ``I_i`` (prediction and label are ``i``),
``P_i`` (prediction is ``i``) and ``L_i`` (label is ``i``). The areas are int64 counts, so
summing them over ranks gives exactly the single-process numbers.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import numpy as np
import torch

from ppdist.metrics.base import Metric
from ppdist.metrics.report import ClassBars, ConfusionMatrix, ReportItem
from ppdist.registry import METRICS
from ppdist.utils.display import class_name

INDICATORS = ("miou", "acc", "kappa", "mdice")


def class_areas(
    pred: torch.Tensor, label: torch.Tensor, num_classes: int, ignore_index: int = 255
) -> np.ndarray:
    """``[3, C]`` int64 array of intersection, prediction and label areas (ignored pixels excluded)."""
    pred = pred.reshape(-1).long()
    label = label.reshape(-1).long().to(pred.device)
    valid = label != ignore_index
    pred, label = pred[valid], label[valid]
    intersect = torch.bincount(pred[pred == label], minlength=num_classes)[:num_classes]
    pred_area = torch.bincount(pred, minlength=num_classes)[:num_classes]
    label_area = torch.bincount(label, minlength=num_classes)[:num_classes]
    return torch.stack([intersect, pred_area, label_area]).cpu().numpy().astype(np.int64)


def metrics_from_areas(
    intersect: np.ndarray, pred_area: np.ndarray, label_area: np.ndarray
) -> Dict[str, Any]:
    """mIoU, Acc, Kappa, mDice and per-class IoU / precision / recall / Dice."""
    i, p, g = (np.asarray(a, dtype=np.float64) for a in (intersect, pred_area, label_area))
    union = p + g - i
    iou = np.where(union > 0, i / np.where(union > 0, union, 1), 0.0)  # empty union counts as 0 (PaddleSeg)
    precision = np.where(p > 0, i / np.where(p > 0, p, 1), 0.0)
    recall = np.where(g > 0, i / np.where(g > 0, g, 1), 0.0)
    dice = np.where(p + g > 0, 2 * i / np.where(p + g > 0, p + g, 1), 0.0)
    total_p, total_l = p.sum(), g.sum()
    acc = float(i.sum() / total_p) if total_p > 0 else 0.0
    if total_l > 0:
        po = i.sum() / total_l
        pe = float((p * g).sum()) / float(total_l * total_l)
        kappa = float((po - pe) / (1 - pe)) if pe != 1 else 1.0
    else:
        kappa = 0.0
    return {
        "miou": float(iou.mean()),
        "acc": acc,
        "kappa": kappa,
        "mdice": float(dice.mean()),
        "class_iou": iou.tolist(),
        "class_precision": precision.tolist(),
        "class_recall": recall.tolist(),
        "class_dice": dice.tolist(),
    }


@METRICS.register
class SegMetric(Metric):
    """``update(pred_labels [N,H,W], batch)`` against ``batch["label"]``; see the module doc."""

    def __init__(self, num_classes: int, ignore_index: int = 255, main_indicator: str = "miou") -> None:
        if main_indicator not in INDICATORS:
            raise ValueError(f"SegMetric.main_indicator must be one of {INDICATORS}, got {main_indicator!r}")
        if num_classes is None or num_classes <= 0:
            raise ValueError("num_classes must be a positive integer (set Global.num_classes)")
        self.num_classes = int(num_classes)
        self.ignore_index = int(ignore_index)
        self.main_indicator = main_indicator
        self.class_names: List[str] = []
        self.reset()

    def bind_dataset(self, dataset: Any) -> None:
        """The eval dataset (called by the evaluator): its class names label the pictures."""
        self.class_names = list(getattr(dataset, "label_list", []) or [])

    def reset(self) -> None:
        self.areas = np.zeros((3, self.num_classes), dtype=np.int64)
        self.confusion = np.zeros((self.num_classes, self.num_classes), dtype=np.int64)  # [label, pred]
        self.images = 0

    def update(self, results: Any, batch: Mapping[str, Any]) -> None:
        label = torch.as_tensor(batch["label"])
        pred = torch.as_tensor(results)
        if pred.shape != label.shape:
            raise ValueError(
                f"prediction shape {tuple(pred.shape)} differs from label shape {tuple(label.shape)}"
            )
        self.areas += class_areas(pred, label, self.num_classes, self.ignore_index)
        self.confusion += confusion_counts(pred, label, self.num_classes, self.ignore_index)
        self.images += int(label.shape[0])

    def state(self) -> Dict[str, Any]:
        return {"areas": self.areas.tolist(), "confusion": self.confusion, "images": self.images}

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        self.reset()
        for state in states:
            self.areas += np.asarray(state["areas"], dtype=np.int64)
            self.confusion += np.asarray(state.get("confusion", 0), dtype=np.int64)
            self.images += int(state["images"])

    def compute(self) -> Dict[str, Any]:
        out = dict(metrics_from_areas(*self.areas), images=self.images)
        self.nothing_evaluated = None
        if self.areas[2].sum() == 0:  # no pixel to score: nan, not PaddleSeg's 0 of an empty union
            self.nothing_evaluated = (
                f"no pixel of the {self.images} evaluated image(s) has a label in 0..{self.num_classes - 1} "
                f"(every one is ignore_index {self.ignore_index} or out of range)"
            )
            out.update({name: float("nan") for name in INDICATORS})
        return out

    def report(self) -> List[ReportItem]:
        """``confusion_matrix.png`` (normalised per label row) and ``class_iou.png``."""
        names = [class_name(c, self.class_names) for c in range(self.num_classes)]
        scores = metrics_from_areas(*self.areas)
        return [
            ConfusionMatrix(
                "confusion_matrix.png",
                self.confusion,
                names,
                "pixels, normalised per label",
                normalize_rows=True,
            ),
            ClassBars(
                "class_iou.png", scores["class_iou"], names, f"IoU per class (mIoU {scores['miou']:.4f})"
            ),
        ]


def confusion_counts(
    pred: torch.Tensor, label: torch.Tensor, num_classes: int, ignore_index: int
) -> np.ndarray:
    """``[num_classes, num_classes]`` pixel counts ``[label, prediction]`` over the non-ignored pixels."""
    keep = label != ignore_index
    index = label[keep].to(torch.int64) * num_classes + pred[keep].to(torch.int64).clamp(0, num_classes - 1)
    counts = torch.bincount(index.flatten(), minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes).cpu().numpy().astype(np.int64)
