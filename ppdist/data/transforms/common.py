"""Task-independent transforms: image decoding and key selection."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import cv2
import numpy as np

from ppdist.data.image_size import DEFAULT_MAX_IMAGE_PIXELS, check_image_pixels
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS

Sample = Dict[str, Any]

IMG_MODES = ("GRAY", "RGB", "BGR")


@TRANSFORMS.register
class DecodeImage:
    """Decode ``data["image"]`` (encoded file bytes) into a uint8 array.

    ``img_mode`` GRAY gives (H, W); RGB / BGR give (H, W, 3) (``channel_first``: (C, H, W)).
    Returns ``None`` when the bytes cannot be decoded; an image whose header says it has more
    than ``max_image_pixels`` (``Global.max_image_pixels``) is rejected before decoding.
    """

    def __init__(
        self,
        img_mode: str = "RGB",
        channel_first: bool = False,
        ignore_orientation: bool = False,
        max_image_pixels: Optional[int] = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        if img_mode not in IMG_MODES:
            raise ConfigError(f"DecodeImage.img_mode must be one of {', '.join(IMG_MODES)}, got {img_mode!r}")
        self.img_mode = img_mode
        self.channel_first = channel_first
        self.flags = cv2.IMREAD_COLOR | (cv2.IMREAD_IGNORE_ORIENTATION if ignore_orientation else 0)
        self.max_image_pixels = max_image_pixels

    def __call__(self, data: Sample) -> Optional[Sample]:
        raw = data["image"]
        if isinstance(raw, np.ndarray):
            buf = raw.reshape(-1).view(np.uint8)
        elif isinstance(raw, (bytes, bytearray, memoryview)):
            buf = np.frombuffer(raw, dtype=np.uint8)
        else:
            raise TypeError(f"DecodeImage expects encoded bytes in data['image'], got {type(raw).__name__}")
        if buf.size == 0:
            return None
        check_image_pixels(memoryview(buf), self.max_image_pixels)
        img = cv2.imdecode(buf, self.flags)
        if img is None:
            return None
        if self.img_mode == "GRAY":
            img = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
        elif self.img_mode == "RGB":
            img = np.ascontiguousarray(img[:, :, ::-1])
        if self.channel_first:
            img = img[None] if img.ndim == 2 else np.ascontiguousarray(img.transpose(2, 0, 1))
        data["image"] = img
        return data


@TRANSFORMS.register
class KeepKeys:
    """Keep only ``keep_keys`` (in that order); a missing key is a configuration mistake."""

    def __init__(self, keep_keys: List[str]) -> None:
        if not keep_keys:
            raise ConfigError("KeepKeys.keep_keys must name at least one key")
        self.keep_keys = list(keep_keys)

    def __call__(self, data: Sample) -> Sample:
        missing = [k for k in self.keep_keys if k not in data]
        if missing:
            raise KeyError(
                f"KeepKeys: key {missing[0]!r} is not in the sample; available keys: "
                + ", ".join(repr(k) for k in data)
                + " (check keep_keys and the transforms before KeepKeys)"
            )
        return {k: data[k] for k in self.keep_keys}
