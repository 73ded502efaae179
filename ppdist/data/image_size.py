"""An image's size from its file header, checked before decoding (a small PNG can decode to GBs)."""

from __future__ import annotations

import io
import warnings
from typing import Optional, Tuple, Union

from PIL import Image

from ppdist.data.base import RejectedSample

DEFAULT_MAX_IMAGE_PIXELS = 89_478_485  # Pillow's decompression-bomb threshold (~ 9459 x 9459)
Source = Union[str, bytes, bytearray, memoryview]


def header_size(source: Source) -> Optional[Tuple[int, int]]:
    """(width, height) from the header of an image file or its bytes (nothing is decoded); None
    when Pillow does not know the format (the decoder then decides)."""
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # measure any size here; the caller applies its own limit
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(source if isinstance(source, str) else io.BytesIO(bytes(source))) as handle:
                return handle.size
    except (OSError, ValueError, SyntaxError):
        return None
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def check_image_pixels(source: Source, limit: Optional[int]) -> None:
    """``RejectedSample`` when the image would decode to more than ``limit`` pixels (no limit: None)."""
    if not limit:
        return
    size = header_size(source)
    if size is not None and size[0] * size[1] > limit:
        raise RejectedSample(
            f"image of {size[0]} x {size[1]} pixels is over Global.max_image_pixels {limit:,}; not decoded "
            f"(raise the limit if such images are meant)"
        )
