"""Evaluation pictures drawn from what the metrics computed (``tools/eval.py --output_dir``, and the
final evaluation of a training): detection precision/recall curves from COCOeval's precision array,
confusion matrices, per-class IoU bars, and a gallery of the worst recognition mistakes."""

from __future__ import annotations

import io
import math
from collections import Counter
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
from PIL import Image
from rapidfuzz.distance import Levenshtein

from ppdist.visualize.figures import display_image, new_figure, save_png

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


def dataset_image(dataset: Any, index: int) -> Optional[np.ndarray]:
    """Sample ``index`` of ``dataset`` as stored (its ``read(index)["image"]``: encoded bytes or
    an array) as HxWx3 uint8 RGB; None when there is no dataset, no index or it cannot be read."""
    if dataset is None or index < 0 or not hasattr(dataset, "read"):
        return None
    try:
        image = dataset.read(index)["image"]
        if isinstance(image, (bytes, bytearray, memoryview)):
            with Image.open(io.BytesIO(bytes(image))) as decoded:
                return np.asarray(decoded.convert("RGB"))
        return display_image(image, bgr=False)
    except Exception:  # a picture of the mistakes never fails the evaluation
        return None


def sample_origin(dataset: Any, index: int) -> str:
    """Where sample ``index`` comes from (the dataset's ``origin``, e.g. ``val.txt:12 (img.png)``)."""
    if dataset is None or index < 0:
        return "?" if index < 0 else f"sample {index}"
    origin = getattr(dataset, "origin", None)
    return str(origin(index)) if origin is not None else f"sample {index}"


def character_confusion(pairs: Sequence[Tuple[str, str]], top: int = 20) -> str:
    """Markdown: the most frequent character substitutions, deletions and insertions that turn
    each label into its (wrong) prediction (Levenshtein edit operations)."""
    replaced: Counter = Counter()
    deleted: Counter = Counter()
    inserted: Counter = Counter()
    for label, pred in pairs:
        for op in Levenshtein.editops(label, pred):
            if op.tag == "replace":
                replaced[(label[op.src_pos], pred[op.dest_pos])] += 1
            elif op.tag == "delete":
                deleted[label[op.src_pos]] += 1
            else:
                inserted[pred[op.dest_pos]] += 1
    lines = [f"# Character confusions of {len(pairs)} wrong prediction(s)", ""]
    lines += ["| label char | predicted | count |", "|---|---|---|"]
    lines += [f"| {_char(a)} | {_char(b)} | {n} |" for (a, b), n in replaced.most_common(top)]
    lines += ["", "| missed (deleted) | count |", "|---|---|"] + [
        f"| {_char(c)} | {n} |" for c, n in deleted.most_common(top)
    ]
    lines += ["", "| extra (inserted) | count |", "|---|---|"] + [
        f"| {_char(c)} | {n} |" for c, n in inserted.most_common(top)
    ]
    return "\n".join(lines) + "\n"


def _char(char: str) -> str:
    """One character as a markdown table cell (a space, ``|`` and a backtick stay readable)."""
    return {" ": "(space)", "|": "`\\|`", "`": "(backtick)"}.get(char, f"`{char}`")


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[object]], title: Optional[str] = None
) -> str:
    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
