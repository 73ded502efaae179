"""Table evaluation pictures (``TableMetric.report``): the tables predicted worst, drawn with the
predicted and the labelled cell boxes, and structure accuracy (with mean TEDS) by structure length."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ppdist.visualize.figures import new_figure, save_png

PRED_RGB = (0.85, 0.1, 0.1)  # predicted cell boxes: red
LABEL_RGB = (0.1, 0.65, 0.1)  # labelled cell boxes: green


def accuracy_picture(rows: Sequence[Mapping[str, Any]], out_path: str) -> None:
    """Bars of structure accuracy per length bin (each labelled with its table count), mean TEDS
    as a line when computed."""
    figure = new_figure((min(1400, 300 + 45 * len(rows)), 500))
    axes = figure.add_subplot(1, 1, 1)
    positions = np.arange(len(rows))
    axes.bar(positions, [r["acc"] for r in rows], color="C0", label="structure accuracy")
    for x, row in zip(positions, rows):
        axes.text(x, row["acc"] + 0.01, f"n={row['tables']}", ha="center", fontsize=7)
    if any(r["teds"] is not None for r in rows):
        teds = [r["teds"] if r["teds"] is not None else np.nan for r in rows]
        axes.plot(positions, teds, "o-", color="C1", label="mean TEDS (structure)")
    axes.set_xticks(positions, [r["lengths"] for r in rows], rotation=90, fontsize=8)
    axes.set_xlabel("labelled structure length (tokens)")
    axes.set_ylim(min(0.0, *(r["teds"] for r in rows if r["teds"] is not None)), 1.08)
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize="small", loc="lower left")
    axes.set_title("structure accuracy by structure length")
    figure.tight_layout()
    save_png(figure, out_path)


def draw_boxes(axes: Any, boxes: Sequence[Any], colour: Sequence[float], style: str = "-") -> None:
    """Cell boxes (x1, y1, x2, y2, or 8-value polygons) on ``axes`` in ``colour``."""
    from matplotlib.patches import Polygon, Rectangle  # noqa: PLC0415  (heavy; loaded by the first figure)

    for box in boxes:
        box = np.asarray(box, dtype=np.float64).reshape(-1)
        if box.size == 8:
            patch: Any = Polygon(box.reshape(4, 2), closed=True, fill=False)
        else:
            patch = Rectangle((box[0], box[1]), box[2] - box[0], box[3] - box[1], fill=False)
        patch.set_edgecolor(colour)
        patch.set_linewidth(2)
        patch.set_linestyle(style)
        axes.add_patch(patch)


def tables_gallery(items: Sequence[Mapping[str, Any]], out_path: str, columns: int = 3) -> None:
    """A grid of tables in the order given, each its image (or a note without one) with the labelled
    cell boxes (green, dashed) and the predicted ones (red): ``{"image": HxWx3 uint8 or None,
    "pred_boxes", "label_boxes", "title"}`` each."""
    columns = max(1, min(columns, len(items)))
    rows = max(1, math.ceil(len(items) / columns))
    figure = new_figure((460 * columns, 420 * rows))
    for position, item in enumerate(items):
        axes = figure.add_subplot(rows, columns, position + 1)
        axes.set_axis_off()
        image: Optional[np.ndarray] = item.get("image")
        if image is not None:
            axes.imshow(image, interpolation="nearest")
            draw_boxes(axes, item["label_boxes"], LABEL_RGB, "--")
            draw_boxes(axes, item["pred_boxes"], PRED_RGB)
        else:
            axes.text(0.5, 0.5, "(image not available)", ha="center", va="center", color="grey")
        axes.set_title(item["title"], fontsize=8)
    figure.tight_layout()
    save_png(figure, out_path)
