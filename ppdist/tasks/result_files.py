"""What the tasks' result writers (``tools/infer.py``'s files) share: file stems, the pseudo-colour
palette, a legend strip of class colours under a picture."""

from __future__ import annotations

import os
from typing import List, Sequence

import cv2
import numpy as np

from ppdist.utils.display import class_name
from ppdist.visualize.palette import flat_palette


def pseudo_colour_palette(size: int = 256) -> List[int]:
    """Flat ``[r, g, b, ...]`` palette of pseudo-colour PNGs, class ``i`` at ``3 * i``: the colours
    PaddleSeg's predictions use, those of ``tools/browse_dataset.py`` (``ppdist.visualize.palette``)."""
    return flat_palette(size)


def file_stem(path: str) -> str:
    """The file name of ``path`` without folder and extension."""
    return os.path.splitext(os.path.basename(path))[0]


LEGEND_ROW_PX = 16


def legend_strip(
    width: int, classes: Sequence[int], colours_bgr: np.ndarray, names: Sequence[str]
) -> np.ndarray:
    """A white BGR strip at least ``width`` wide (wider when a name needs it): one row per class
    of ``classes``, its colour and name."""
    texts = [class_name(cls, names) for cls in classes]
    widest = max((cv2.getTextSize(t, cv2.FONT_HERSHEY_SIMPLEX, 0.4, 1)[0][0] for t in texts), default=0)
    strip = np.full((LEGEND_ROW_PX * len(classes) + 4, max(width, widest + 26), 3), 255, np.uint8)
    for row, (cls, text) in enumerate(zip(classes, texts)):
        top = 2 + row * LEGEND_ROW_PX
        colour = tuple(int(c) for c in colours_bgr[cls])
        cv2.rectangle(strip, (4, top + 2), (16, top + LEGEND_ROW_PX - 3), colour, -1)
        cv2.putText(strip, text, (22, top + 12), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
    return strip


def stack_legend(image: np.ndarray, legend: np.ndarray) -> np.ndarray:
    """``image`` above ``legend``, the narrower one padded with white on the right."""
    width = max(image.shape[1], legend.shape[1])
    pad = [np.pad(a, ((0, 0), (0, width - a.shape[1]), (0, 0)), constant_values=255) for a in (image, legend)]
    return np.concatenate(pad)
