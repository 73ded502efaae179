"""Detection geometry recorded instead of applied: ``RandomExpand``, ``RandomCrop`` and
``RandomFlip`` change a ``PendingImage`` (a few integers) and transform the boxes at once; the
first op that needs pixels (a resize, the photometric ops, the normalisation, or the collate)
materialises the canvas once: the visible part of the decoded image, mirrored when flipped, with the
expansion's fill around it (``cv2.copyMakeBorder``). That is exactly the step-by-step result, but
only the kept window is drawn (not the whole expanded canvas, up to 16x the image, before the crop)
and nothing is copied for the crop and the flip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import cv2
import numpy as np


@dataclass
class PendingImage:
    """A ``height`` x ``width`` canvas that shows ``source`` (H, W, C) with its pixel (0, 0) at
    (``top``, ``left``) of the unmirrored canvas, ``fill`` elsewhere; ``mirrored``: the canvas
    is then flipped left-right. Only the source pixels inside ``window`` (rows [r0, r1), columns
    [c0, c1)) are still part of the image: a crop drops the others for good."""

    source: np.ndarray
    height: int
    width: int
    top: int = 0
    left: int = 0
    mirrored: bool = False
    fill: Optional[Tuple[float, ...]] = None
    window: Tuple[int, int, int, int] = (0, 0, 0, 0)

    @classmethod
    def of(cls, image: np.ndarray) -> "PendingImage":
        rows, cols = int(image.shape[0]), int(image.shape[1])
        return cls(image, rows, cols, window=(0, rows, 0, cols))

    @property
    def shape(self) -> Tuple[int, ...]:
        return (self.height, self.width) + tuple(self.source.shape[2:])

    @property
    def dtype(self) -> np.dtype:
        return self.source.dtype

    @property
    def ndim(self) -> int:
        return self.source.ndim

    def expand(self, height: int, width: int, top: int, left: int, fill: Tuple[float, ...]) -> "PendingImage":
        """Place the canvas at (``top``, ``left``) of a larger ``fill`` canvas."""
        if self.fill is not None and self.shows_fill() and tuple(self.fill) != tuple(fill):
            return PendingImage.of(self.materialize()).expand(height, width, top, left, fill)
        shift = width - self.width - left if self.mirrored else left
        return PendingImage(
            self.source,
            height,
            width,
            self.top + top,
            self.left + shift,
            self.mirrored,
            tuple(fill),
            self.window,
        )

    def crop(self, x1: int, y1: int, x2: int, y2: int) -> "PendingImage":
        """Keep the window [x1, x2) x [y1, y2) of the canvas."""
        width, height = x2 - x1, y2 - y1
        shift = width - self.width + x1 if self.mirrored else -x1
        cropped = PendingImage(
            self.source,
            height,
            width,
            self.top - y1,
            self.left + shift,
            self.mirrored,
            self.fill,
            self.window,
        )
        cropped.window = cropped._visible()
        return cropped

    def flip(self) -> "PendingImage":
        """Mirror the canvas left-right."""
        return PendingImage(
            self.source,
            self.height,
            self.width,
            self.top,
            self.left,
            not self.mirrored,
            self.fill,
            self.window,
        )

    def _visible(self) -> Tuple[int, int, int, int]:
        """Source rows [i0, i1) and columns [j0, j1) of the window inside the canvas."""
        r0, r1, c0, c1 = self.window
        i0, i1 = max(r0, -self.top), min(r1, self.height - self.top)
        j0, j1 = max(c0, -self.left), min(c1, self.width - self.left)
        return i0, max(i0, i1), j0, max(j0, j1)

    def shows_fill(self) -> bool:
        i0, i1, j0, j1 = self._visible()
        return (i1 - i0, j1 - j0) != (self.height, self.width)

    def materialize(self) -> np.ndarray:
        """The canvas as an array (a view of ``source`` when it is a plain crop of it)."""
        i0, i1, j0, j1 = self._visible()
        region = self.source[i0:i1, j0:j1]
        if region.size and self.mirrored:
            region = cv2.flip(region, 1)
        top, left = i0 + self.top, j0 + self.left
        bottom, right = self.height - top - (i1 - i0), self.width - left - (j1 - j0)
        if self.mirrored:
            left, right = right, left
        if not (top or bottom or left or right):
            return region
        if self.fill is None:
            raise ValueError("a pending image shows canvas outside its source but has no fill")
        if not region.size:
            out = np.empty(self.shape, dtype=self.dtype)
            out[...] = np.asarray(self.fill, dtype=self.dtype)[: self.shape[2] if self.ndim == 3 else 1]
            return out
        return cv2.copyMakeBorder(region, top, bottom, left, right, cv2.BORDER_CONSTANT, value=self.fill)

    def resized(self, width: int, height: int, interpolation: int) -> np.ndarray:
        """``cv2.resize`` of the canvas to ``width`` x ``height`` (drawn first, then dropped)."""
        return cv2.resize(self.materialize(), (width, height), interpolation=interpolation)


def pending(data: Dict[str, Any]) -> PendingImage:
    """``data["image"]`` as a pending image (wrapping a plain array)."""
    image = data["image"]
    return image if isinstance(image, PendingImage) else PendingImage.of(image)


def materialize(data: Dict[str, Any]) -> Dict[str, Any]:
    """``data`` with a pending ``image`` made an array (any other value left as it is)."""
    image = data.get("image")
    if isinstance(image, PendingImage):
        data["image"] = image.materialize()
    return data
