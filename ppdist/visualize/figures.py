"""Figures without a display (matplotlib's Agg canvas, no global pyplot state), saved atomically.

matplotlib (~0.4 s to import) is loaded by the first figure, not by ``import ppdist``: the
processes that draw nothing (the other ranks, export, inference) never load it. The drawing
modules import ``matplotlib.patches`` where they draw, after ``new_figure`` loaded matplotlib."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Tuple

import numpy as np
import torch

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


def display_image(image: Any, bgr: bool) -> np.ndarray:
    """A (C, H, W) or (H, W, C) image of any range as (H, W, 3) uint8 RGB."""
    array = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    array = array.astype(np.float32)
    if array.ndim == 2:
        array = array[None]
    if array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    low, high = float(array.min()), float(array.max())
    array = (array - low) / (high - low) * 255.0 if high > low else np.zeros_like(array)
    array = array.round().clip(0, 255).astype(np.uint8)
    return np.ascontiguousarray(array[..., ::-1]) if bgr else array
