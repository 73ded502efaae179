"""PIL's ImageEnhance and HSV hue shift on uint8 RGB arrays with OpenCV (``RandomDistort``).

``Image.blend(degenerate, image, f)`` computes ``trunc(d + f * (v - d))`` in float32, clipped to
0..255. Brightness (``d = 0``) and contrast (``d`` = the rounded mean of PIL's grey image) blend with
a constant, so a 256-entry table reproduces them exactly. Saturation blends with each pixel's grey
value (``cv2.addWeighted``; OpenCV's grey rounds its weights slightly differently from PIL's: at
most 1 level apart). The hue shift goes through OpenCV's full-range HSV (256 hue steps per turn)
instead of PIL's (255, with truncated hue and saturation): the same rotation, quantised a little
differently (see the tests). Sharpness keeps PIL's smoothing filter.
"""

from __future__ import annotations

import cv2
import numpy as np
from PIL import Image, ImageEnhance

_LEVELS = np.arange(256, dtype=np.float32)
# added before OpenCV's rounding so that it truncates like PIL (exact integers stay themselves)
_TRUNCATE = -0.5 + 1e-3


def blend_table(degenerate: float, factor: float) -> np.ndarray:
    """PIL's blend of a constant ``degenerate`` with each level 0..255, as a uint8 table."""
    out = np.float32(degenerate) + np.float32(factor) * (_LEVELS - np.float32(degenerate))
    return np.clip(np.trunc(out), 0, 255).astype(np.uint8)


def grey(img: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)


def brightness(img: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Brightness(img).enhance(factor)`` (exact)."""
    return cv2.LUT(img, blend_table(0.0, factor))


def contrast(img: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Contrast(img).enhance(factor)``: a blend with the mean grey level."""
    mean = int(cv2.mean(grey(img))[0] + 0.5)
    return cv2.LUT(img, blend_table(mean, factor))


def saturation(img: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Color(img).enhance(factor)``: a blend with each pixel's grey value."""
    degenerate = cv2.cvtColor(grey(img), cv2.COLOR_GRAY2RGB)
    return cv2.addWeighted(img, factor, degenerate, 1.0 - factor, _TRUNCATE)


def hue(img: np.ndarray, delta: float) -> np.ndarray:
    """Rotate the hue by ``delta`` steps of PIL's 8-bit hue (255 per turn): OpenCV's hue (256 per
    turn) plus ``floor(delta * 256 / 255)``, wrapping (PIL truncates ``hue + delta``: the same
    but for hues less than ``-delta`` when turning down, one step apart)."""
    hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV_FULL)
    plane = hsv[:, :, 0]
    np.add(plane, np.uint8(int(np.floor(delta * 256.0 / 255.0)) % 256), out=plane)  # uint8 wraps
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB_FULL)


def sharpness(img: np.ndarray, factor: float) -> np.ndarray:
    """``ImageEnhance.Sharpness(img).enhance(factor)`` (PIL itself)."""
    return np.asarray(ImageEnhance.Sharpness(Image.fromarray(img, mode="RGB")).enhance(factor))
