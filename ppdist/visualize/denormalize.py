"""Undo a pipeline's normalisation for display: the mean, std and scale are read from the built
transform ops (a config's ``NormalizeImage`` / ``Normalize`` entries with their defaults, or
``RecResizeImg``'s own), the channel order from its ``DecodeImage``; nothing is assumed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from ppdist.data.transforms import DecodeImage, Normalize, NormalizeImage, RecResizeImg
from ppdist.data.transforms.rec import RESIZE_NORM_MEAN, RESIZE_NORM_STD
from ppdist.utils.display import display_image


@dataclass
class Normalization:
    """``normalised = (pixel * scale - mean) / std`` per channel, and the decoded channel order."""

    mean: np.ndarray
    std: np.ndarray
    scale: float
    bgr: bool = False
    source: str = ""


def _of(op: Any) -> Optional[Normalization]:
    if isinstance(op, NormalizeImage):
        if op.norm_type == "mean_std":
            mean, std = op.mean, op.std
        else:
            mean, std = np.zeros(1, np.float32), np.ones(1, np.float32)
        return Normalization(mean, std, 1 / 255.0 if op.is_scale else 1.0, source="NormalizeImage")
    if isinstance(op, Normalize):
        return Normalization(op.mean, op.std, 1 / 255.0, source="Normalize")
    if isinstance(op, RecResizeImg):
        mean, std = np.float32([RESIZE_NORM_MEAN]), np.float32([RESIZE_NORM_STD])
        return Normalization(mean, std, 1 / 255.0, source="RecResizeImg")
    return None


def find_normalization(ops: Sequence[Any]) -> Optional[Normalization]:
    """The last normalising op of ``ops`` (sample then batch transforms, in order), or None."""
    found: Optional[Normalization] = None
    bgr = False
    for op in ops:
        if isinstance(op, DecodeImage):
            bgr = op.img_mode == "BGR"
        found = _of(op) or found
    if found is not None:
        found.bgr = bgr
    return found


def to_display(image: Any, normalization: Optional[Normalization], bgr: bool = False) -> np.ndarray:
    """A (C, H, W) or (H, W, C) model input as (H, W, 3) uint8 RGB pixels: the normalisation
    inverted when known; else shown as is when it is within 0..255, or rescaled by its range."""
    array = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    array = array.astype(np.float32)
    if array.ndim == 2:
        array = array[None]
    if array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)
    if normalization is not None:
        bgr = normalization.bgr
        array = (array * normalization.std + normalization.mean) / normalization.scale
    elif array.min() < 0 or array.max() > 255:
        return display_image(array, bgr)
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    array = array.round().clip(0, 255).astype(np.uint8)
    return np.ascontiguousarray(array[..., ::-1]) if bgr else array
