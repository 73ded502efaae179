"""Figures without a display (matplotlib's Agg canvas, no global pyplot state), saved atomically.

matplotlib (~0.4 s to import) is loaded by the first figure, not by ``import ppdist``: the
processes that draw nothing (the other ranks, export, inference) never load it. The drawing
modules import ``matplotlib.patches`` where they draw, after ``new_figure`` loaded matplotlib."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from ppdist.utils.atomic import atomic_file

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100


def new_figure(size_px: Tuple[int, int]) -> Figure:
    """A figure of ``(width, height)`` pixels at ``DPI``."""
    # heavy: loaded by the first figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    figure = Figure(figsize=(size_px[0] / DPI, size_px[1] / DPI), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure


def save_png(figure: Figure, path: str) -> None:
    """Write ``figure`` to ``path`` as PNG atomically (a reader sees the old picture or the new one)."""
    with atomic_file(path, binary=True) as handle:
        figure.savefig(handle, format="png", dpi=DPI)
