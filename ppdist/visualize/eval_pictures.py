"""Evaluation pictures drawn from what the metrics computed (``tools/eval.py --output_dir``, and the
final evaluation of a training): detection precision/recall curves from COCOeval's precision array,
confusion matrices, per-class IoU bars, and a gallery of the worst recognition mistakes.
``write_report`` writes a metric's ``report()`` (``ppdist.metrics.report``: text files and picture
data) into a folder; the metrics themselves draw nothing."""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Dict, List, Sequence

import numpy as np

from ppdist.metrics.report import (
    AccuracyByLength,
    ClassBars,
    ConfusionMatrix,
    MistakesGallery,
    PRCurves,
    ReportItem,
    TablesGallery,
    TextFile,
)
from ppdist.utils.atomic import write_text_atomic
from ppdist.visualize.figures import new_figure, save_png
from ppdist.visualize.table_pictures import accuracy_picture, tables_gallery

MAX_LEGEND_CLASSES = 20  # more classes: their PR curves drawn unnamed, thin and grey


def pr_curves(
    precision: np.ndarray, recall_thresholds: np.ndarray, class_names: Sequence[str], out_path: str
) -> Dict[str, np.ndarray]:
    """Precision against recall from COCOeval's ``eval["precision"]`` ``[T, R, K, A, M]`` (area
    all, the last maxDets): each class at IoU 0.5, and all classes at IoU 0.5 and 0.5:0.95
    (the mean over classes and thresholds of the defined values, -1 left out); each named with its
    AP (the mean of its curve). Returns the plotted curves by label."""
    at_50 = precision[0, :, :, 0, -1]  # [R, K]
    curves: Dict[str, np.ndarray] = {}
    for k in range(at_50.shape[1]):
        name = class_names[k] if k < len(class_names) else str(k)
        curves[f"{name} (IoU 0.5)"] = at_50[:, k]
    curves["all classes (IoU 0.5)"] = _mean_defined(at_50, axis=1)
    curves["all classes (IoU 0.5:0.95)"] = _mean_defined(
        precision[:, :, :, 0, -1].transpose(1, 0, 2).reshape(len(recall_thresholds), -1), axis=1
    )
    figure = new_figure((900, 600))
    axes = figure.add_subplot(1, 1, 1)
    many = at_50.shape[1] > MAX_LEGEND_CLASSES  # thin grey class curves, only the summaries named
    for label, values in curves.items():
        shown = np.where(values >= 0, values, np.nan)  # -1: a class without ground truth
        defined = values[values > -1]
        shown_label = f"{label}: AP {defined.mean():.3f}" if defined.size else f"{label}: no ground truth"
        if label.startswith("all"):
            style: Dict[str, Any] = {"linewidth": 2.5, "color": "black", "label": shown_label}
            if label.endswith("0.5:0.95)"):
                style["linestyle"] = "--"
        elif many:
            style = {"linewidth": 0.6, "color": "grey", "alpha": 0.5}
        else:
            style = {"linewidth": 1, "label": shown_label}
        axes.plot(recall_thresholds, shown, **style)
    axes.set_xlabel("recall")
    axes.set_ylabel("precision")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="lower left")
    axes.set_title("precision-recall (COCOeval, area all, maxDets 100)")
    figure.tight_layout()
    save_png(figure, out_path)
    return curves


def _mean_defined(values: np.ndarray, axis: int) -> np.ndarray:
    defined = values > -1
    total = np.where(defined, values, 0.0).sum(axis=axis)
    count = defined.sum(axis=axis)
    return np.where(count > 0, total / np.maximum(count, 1), -1.0)


def confusion_picture(
    matrix: np.ndarray, names: Sequence[str], out_path: str, title: str, normalize_rows: bool = False
) -> np.ndarray:
    """Draw a confusion matrix (rows: truth, columns: prediction), each cell coloured by its share
    of its row (a large row, e.g. detection's background, does not wash out the others) and
    labelled with that share (``normalize_rows``) or its count. Returns the shares."""
    counts = matrix.astype(np.float64)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    size = min(1400, 300 + 40 * len(names))
    figure = new_figure((size, size))
    axes = figure.add_subplot(1, 1, 1)
    image = axes.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    figure.colorbar(image, ax=axes, fraction=0.046, label="share of the row")
    axes.set_xticks(range(len(names)), names, rotation=90, fontsize=8)
    axes.set_yticks(range(len(names)), names, fontsize=8)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    axes.set_title(title)
    if len(names) <= 20:
        for (i, j), share in np.ndenumerate(shares):
            text = f"{share:.2f}" if normalize_rows else str(int(counts[i, j]))
            colour = "white" if share > 0.5 else "black"
            axes.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
    figure.tight_layout()
    save_png(figure, out_path)
    return shares


def class_bars(values: Sequence[float], names: Sequence[str], out_path: str, title: str) -> None:
    """One bar per class (e.g. segmentation IoU)."""
    figure = new_figure((min(1400, 300 + 40 * len(names)), 500))
    axes = figure.add_subplot(1, 1, 1)
    axes.bar(range(len(values)), values, color="C0")
    axes.set_xticks(range(len(names)), names, rotation=90, fontsize=8)
    axes.set_ylim(0, 1)
    axes.set_title(title)
    axes.grid(axis="y", alpha=0.3)
    for i, value in enumerate(values):
        axes.text(i, value + 0.01, f"{value:.3f}", ha="center", fontsize=7)
    figure.tight_layout()
    save_png(figure, out_path)


def mistakes_gallery(mistakes: Sequence[Dict[str, Any]], out_path: str, columns: int = 4) -> None:
    """A grid of recognition mistakes in the order given: ``{"image": HxWx3 uint8 or None,
    "label", "pred", "score", "distance"}`` each (no image: the texts alone)."""
    rows = max(1, math.ceil(len(mistakes) / columns))
    figure = new_figure((360 * columns, 150 * rows))
    for position, item in enumerate(mistakes):
        axes = figure.add_subplot(rows, columns, position + 1)
        axes.set_axis_off()
        if item.get("image") is not None:
            axes.imshow(item["image"])
        else:
            axes.text(0.5, 0.5, "(image not available)", ha="center", va="center", color="grey")
        axes.set_title(
            f"{position + 1}. label {item['label']!r}\npred {item['pred']!r} "
            f"(score {float(item['score']):.2f}, ned {float(item['distance']):.2f})",
            fontsize=8,
        )
    figure.tight_layout()
    save_png(figure, out_path)


DRAWERS: Dict[type, Callable[[Any, str], Any]] = {
    PRCurves: lambda item, path: pr_curves(item.precision, item.recall_thresholds, item.class_names, path),
    ConfusionMatrix: lambda item, path: confusion_picture(
        item.matrix, item.names, path, item.title, normalize_rows=item.normalize_rows
    ),
    ClassBars: lambda item, path: class_bars(item.values, item.names, path, item.title),
    MistakesGallery: lambda item, path: mistakes_gallery(item.mistakes, path),
    TablesGallery: lambda item, path: tables_gallery(item.items, path),
    AccuracyByLength: lambda item, path: accuracy_picture(item.rows, path),
    TextFile: lambda item, path: write_text_atomic(path, item.text),
}


def write_report(items: Sequence[ReportItem], out_dir: str) -> List[str]:
    """Write a metric's report into ``out_dir``, in its order: each picture drawn, each text file
    written (atomically). Returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for item in items:
        path = os.path.join(out_dir, item.file)
        DRAWERS[type(item)](item, path)
        written.append(path)
    return written
