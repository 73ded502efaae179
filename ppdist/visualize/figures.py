"""Figures without a display (matplotlib's Agg canvas, no global pyplot state), saved atomically."""

from __future__ import annotations

from typing import Tuple

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ppdist.utils.atomic import atomic_file

DPI = 100


def new_figure(size_px: Tuple[int, int]) -> Figure:
    """A figure of ``(width, height)`` pixels at ``DPI``."""
    figure = Figure(figsize=(size_px[0] / DPI, size_px[1] / DPI), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure


def save_png(figure: Figure, path: str) -> None:
    """Write ``figure`` to ``path`` as PNG atomically (a reader sees the old picture or the new one)."""
    with atomic_file(path, binary=True) as handle:
        figure.savefig(handle, format="png", dpi=DPI)
