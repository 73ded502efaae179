"""Test helper: a written picture has the expected size and is not blank."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np
from PIL import Image


def assert_picture(
    path: str,
    size: Optional[Tuple[int, int]] = None,
    min_size: Tuple[int, int] = (300, 200),
    min_colours: int = 20,
) -> None:
    """``path`` opens as an image of ``size`` (width, height) exactly, or at least ``min_size``,
    with visible content: pixel spread and more than ``min_colours`` distinct colours."""
    image = np.asarray(Image.open(path).convert("RGB"))
    width, height = image.shape[1], image.shape[0]
    if size is not None:
        assert (width, height) == tuple(size), (path, width, height)
    else:
        assert width >= min_size[0] and height >= min_size[1], (path, width, height)
    assert image.std() > 10 and len(np.unique(image.reshape(-1, 3), axis=0)) > min_colours, path  # not blank


def keep_saved_figures(monkeypatch: Any, module: Any) -> List[Any]:
    """The figures ``module.save_png`` saves from now on, kept for inspection (and still written)."""
    figures: List[Any] = []
    save = module.save_png

    def keep(figure: Any, path: str) -> None:
        figures.append(figure)
        save(figure, path)

    monkeypatch.setattr(module, "save_png", keep)
    return figures
