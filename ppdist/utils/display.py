"""For people: any tensor or array of any range as an HxWx3 uint8 RGB image; a class's name."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch


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


def class_name(cls: int, names: Sequence[str]) -> str:
    """The dataset's name of class ``cls``, else ``class <cls>``."""
    return str(names[cls]) if 0 <= cls < len(names) else f"class {cls}"
