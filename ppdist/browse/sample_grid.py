"""A grid of browsed samples with their targets: boxes and class names (det), the image beside
its label map laid over it in the segmentation palette (``ppdist.visualize.palette``: the colours
of ``tools/infer.py``'s overlays, ``ignore_index`` white) with a legend naming the classes (seg),
the decoded text label (rec), the learned cell boxes with the grid and structure as caption
(table)."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import numpy as np

from ppdist.browse.dataset_browser import Browse, BrowsedSample
from ppdist.tasks import get_task
from ppdist.tasks.table_browse import caption
from ppdist.utils.display import class_name
from ppdist.visualize.figures import new_figure, save_png
from ppdist.visualize.palette import IGNORE_RGB, class_colour, class_colours

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CELL_COLOURS = 6  # table cells cycle through the palette's first colours, neighbours told apart
OVERLAY_ALPHA = 0.6  # weight of the label colours over the image
GAP_PX = 4  # white between a segmentation sample's image and its overlay
LEGEND_PX = 40


def box_colour(cls: int) -> Tuple[float, float, float]:
    """The RGB colour (0..1) a box of class ``cls`` is drawn in (infer's, ``palette``)."""
    return tuple(v / 255.0 for v in class_colour(int(cls)))


def overlay(image: np.ndarray, label_map: np.ndarray, ignore_index: Optional[int]) -> np.ndarray:
    """``image`` blended with the label map's palette colours (ignore: white)."""
    if label_map.shape != image.shape[:2]:  # an eval label kept at full resolution
        rows = np.arange(image.shape[0]) * label_map.shape[0] // image.shape[0]
        cols = np.arange(image.shape[1]) * label_map.shape[1] // image.shape[1]
        label_map = label_map[rows][:, cols]
    ignored = label_map == ignore_index if ignore_index is not None else np.zeros(label_map.shape, bool)
    valid = np.where(ignored, 0, label_map.clip(min=0))
    colours = class_colours(int(valid.max()) + 1)[valid]
    colours[ignored] = IGNORE_RGB
    return ((1 - OVERLAY_ALPHA) * image + OVERLAY_ALPHA * colours).round().astype(np.uint8)


def _title(sample: BrowsedSample) -> str:
    title = f"#{sample.index} {sample.size[0]}x{sample.size[1]}"
    if sample.replaces is not None:
        title += " (bad; next usable shown)"
    if sample.grid is not None:
        return title + ", " + caption(sample.structure, sample.grid)
    if sample.boxes is not None:
        title += f", {len(sample.boxes)} box" + ("" if len(sample.boxes) == 1 else "es")
    if sample.text is not None:
        title += f": {sample.text!r}"
    return title


def _draw_panel(axes, sample: BrowsedSample, browse: Browse) -> None:
    from matplotlib.patches import Rectangle  # noqa: PLC0415  (heavy; loaded by the first figure)

    axes.set_axis_off()
    image = sample.image
    if sample.label_map is not None:
        gap = np.full((image.shape[0], GAP_PX, 3), 255, np.uint8)
        image = np.concatenate([image, gap, overlay(image, sample.label_map, browse.ignore_index)], axis=1)
    axes.imshow(image, interpolation="nearest")
    if sample.grid is not None:
        draw_cells(axes, sample.boxes)
        axes.set_title(_title(sample), fontsize=8)
        return
    boxes = [] if sample.boxes is None else zip(sample.boxes, sample.classes)
    for box, cls in boxes:
        colour = box_colour(int(cls))
        x1, y1, x2, y2 = (float(v) for v in box)
        axes.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=colour, linewidth=2))
        names = browse.class_names
        name = names[cls] if 0 <= cls < len(names) else str(int(cls))
        axes.text(x1, y1, name, color="white", fontsize=7, va="bottom", backgroundcolor=colour)
    axes.set_title(_title(sample), fontsize=8)


def cell_colour(k: int) -> Tuple[float, float, float]:
    """The colour of a table's ``k``-th cell box (the palette's first ``CELL_COLOURS``, cycled)."""
    return box_colour(k % CELL_COLOURS)


def draw_cells(axes, boxes: np.ndarray) -> None:
    """A table's cell boxes: xyxy rectangles, or (N, 8) polygons."""
    from matplotlib.patches import Polygon, Rectangle  # noqa: PLC0415  (heavy; loaded by the first figure)

    for k, box in enumerate(boxes):
        colour = cell_colour(k)
        if len(box) == 8:
            axes.add_patch(
                Polygon(np.reshape(box, (4, 2)), closed=True, fill=False, edgecolor=colour, linewidth=1.5)
            )
        else:
            x1, y1, x2, y2 = (float(v) for v in box)
            axes.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=colour, linewidth=1.5))


def _seg_legend(figure: Figure, samples: Sequence[BrowsedSample], browse: Browse) -> None:
    """The classes on the page, each in its colour with its name (``class i`` without names)."""
    from matplotlib.patches import Patch  # noqa: PLC0415  (heavy; loaded by the first figure)

    ignore_index = browse.ignore_index
    values = sorted({int(v) for s in samples for v in np.unique(s.label_map)} - {ignore_index})
    colours = class_colours(max(values) + 1) if values else np.zeros((0, 3), np.uint8)
    handles = [
        Patch(color=colours[v] / 255.0, label=class_name(v, browse.class_names)) for v in values if v >= 0
    ]
    if ignore_index is not None:
        handles.append(Patch(facecolor="white", edgecolor="black", label=f"ignore ({ignore_index})"))
    figure.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8), fontsize=8, frameon=False)


def render_samples(browse: Browse, samples: Sequence[BrowsedSample]) -> Figure:
    """One page: ``samples`` (with display images) in a grid with their targets."""
    panel = get_task(browse.task).browse  # pages of at most 1560 x 1160 pixels
    columns = min(panel.columns, len(samples))
    rows = math.ceil(len(samples) / columns)
    width, height = panel.panel_px
    legend = LEGEND_PX if panel.class_legend else 0
    figure = new_figure((width * columns, height * rows + legend))
    for position, sample in enumerate(samples):
        _draw_panel(figure.add_subplot(rows, columns, position + 1), sample, browse)
    if legend:
        _seg_legend(figure, samples, browse)
    figure.tight_layout(rect=(0, legend / (height * rows + legend), 1, 1))
    return figure


def page_names(count: int) -> List[str]:
    """File names of ``count`` pages: ``samples.png``, or ``samples_1.png`` ... for several."""
    return ["samples.png"] if count == 1 else [f"samples_{page + 1}.png" for page in range(count)]


def draw_samples(browse: Browse, out_dir: str) -> List[str]:
    """Write the browsed samples (those with display images) as pages of a grid into ``out_dir``;
    returns the paths written."""
    drawn = [s for s in browse.samples if s.image is not None]
    if not drawn:
        raise ValueError(f"{browse.split}: no usable sample to draw ({len(browse.bad)} bad)")
    panel = get_task(browse.task).browse
    per_page = panel.columns * panel.rows_per_page
    pages = [drawn[start : start + per_page] for start in range(0, len(drawn), per_page)]
    paths = [os.path.join(out_dir, name) for name in page_names(len(pages))]
    for page, path in zip(pages, paths):
        save_png(render_samples(browse, page), path)
    return paths
