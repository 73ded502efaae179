"""The one palette of classes: ``tools/infer.py``'s PNGs, overlays and boxes,
``tools/browse_dataset.py``'s label overlays, legends and boxes draw class ``i`` in the same
colour (a detection class is the index of its category among the set's sorted category ids).

The colours are PaddleSeg's: the Pascal VOC colours (bits of the id spread over the channels,
most significant first) of ids 1, 2, ..., so class 0 is not black. ``ignore_index`` is white.
A class is named by the dataset's names when it has them, else ``class i``.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

IGNORE_RGB: Tuple[int, int, int] = (255, 255, 255)


def class_colours(count: int) -> np.ndarray:
    """``(count, 3)`` uint8 RGB: the colour of each class ``0 .. count-1``."""
    colours = np.zeros((count, 3), np.uint8)
    for cls in range(count):
        voc_id = cls + 1
        for bit in range(8):
            for channel in range(3):
                colours[cls, channel] |= ((voc_id >> (3 * bit + channel)) & 1) << (7 - bit)
    return colours


def class_colour(cls: int) -> Tuple[int, int, int]:
    """The RGB colour of class ``cls``."""
    return tuple(int(v) for v in class_colours(cls + 1)[cls])


def flat_palette(size: int = 256) -> List[int]:
    """``[r, g, b, ...]`` of classes ``0 .. size-1`` for a PIL palette ("P" mode) image."""
    return class_colours(size).reshape(-1).tolist()
