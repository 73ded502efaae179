"""Text-recognition transforms: RecAug, CTCLabelEncode, RecResizeImg (PaddleOCR semantics)."""

from __future__ import annotations

import math
import random
from typing import Any, Dict, List, Optional, Tuple

import cv2
import numpy as np

from ppdist.data.base import RejectedSample, add_note
from ppdist.data.charset import load_characters
from ppdist.data.transforms.warp import tia_distort, tia_perspective, tia_stretch
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS

Sample = Dict[str, Any]


# ----------------------------------------------------------------------------- RecAug pieces
GAUSSIAN_KERNEL = cv2.getGaussianKernel(5, 1, ktype=cv2.CV_32F)  # RecAug's blur: 5 taps, sigma 1


def crop_top_or_bottom(img: np.ndarray) -> np.ndarray:
    """Cut 1-8 rows off the top or the bottom (at least one row is kept)."""
    h = img.shape[0]
    rows = min(random.randint(1, 8), h - 1)
    if random.randint(0, 1):
        return img[rows:].copy()
    return img[: h - rows].copy()


def gaussian_blur(img: np.ndarray) -> np.ndarray:
    """A separable 5x5 Gaussian blur, sigma 1 (PaddleOCR's ``sepFilter2D`` call, bit for bit)."""
    return cv2.sepFilter2D(img, -1, GAUSSIAN_KERNEL, GAUSSIAN_KERNEL)


def hsv_value_scale(img: np.ndarray) -> np.ndarray:
    """Scale the HSV value channel by 1 +/- (less than 0.001), truncated; colour images only."""
    if img.ndim != 3 or img.shape[2] != 3:
        return img
    delta = 0.001 * random.random()
    if random.random() <= 0.5000001:  # PaddleOCR's sign draw, after the size
        delta = -delta
    hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
    hsv[:, :, 2] = (hsv[:, :, 2] * (1 + delta)).astype(np.uint8)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)


def shift_jitter(img: np.ndarray) -> np.ndarray:
    """Smear the image diagonally: pixel (y, x) takes the one ``min(y, x, s - 1)`` up-left of it,
    with ``s`` up to 1% of the smaller side (images over 10 px; 0 or 1 leaves it unchanged)."""
    h, w = img.shape[:2]
    if h <= 10 or w <= 10:
        return img
    steps = int(random.random() * min(h, w) * 0.01)
    if steps <= 1:
        return img
    src = img.copy()
    out = img.copy()
    for k in range(1, steps):
        out[k:, k:] = src[: h - k, : w - k]
    return out


def gaussian_noise(img: np.ndarray, mean: float = 0.0, var: float = 0.1) -> np.ndarray:
    """Add half of a N(mean, var) noise, clipped and truncated back to uint8."""
    rng = np.random.default_rng(np.random.randint(0, 2**31))  # seeded via np.random; fast float32
    noise = rng.standard_normal(img.shape, dtype=np.float32) * np.float32(var**0.5) + np.float32(mean)
    return np.clip(img + np.float32(0.5) * noise, 0, 255).astype(np.uint8)


@TRANSFORMS.register
class RecAug:
    """PaddleOCR's recognition augmentation; each distortion fires with its own probability.

    Order: TIA (distort and stretch for images of at least 20x20, then perspective whatever the
    size), top/bottom crop (at least 20x20), Gaussian blur 5x5 sigma 1, HSV value scale, jitter,
    Gaussian noise, inversion. Randomness comes from ``random`` / ``np.random`` (seeded per
    sample), drawn as PaddleOCR draws it: with the same seeds every step but the noise (a faster
    generator, same distribution) gives PaddleOCR's image (the warps within one grey level).
    """

    min_size = 20

    def __init__(
        self,
        tia_prob: float = 0.4,
        crop_prob: float = 0.4,
        reverse_prob: float = 0.4,
        noise_prob: float = 0.4,
        jitter_prob: float = 0.4,
        blur_prob: float = 0.4,
        hsv_aug_prob: float = 0.4,
    ) -> None:
        self.tia_prob = tia_prob
        self.crop_prob = crop_prob
        self.reverse_prob = reverse_prob
        self.noise_prob = noise_prob
        self.jitter_prob = jitter_prob
        self.blur_prob = blur_prob
        self.hsv_aug_prob = hsv_aug_prob

    def __call__(self, data: Sample) -> Sample:
        img = data["image"]
        if not isinstance(img, np.ndarray) or img.ndim not in (2, 3):
            raise TypeError(
                "RecAug expects a decoded (H, W[, C]) image; put DecodeImage before it "
                "with channel_first False"
            )
        h, w = img.shape[:2]
        big = h >= self.min_size and w >= self.min_size
        if random.random() <= self.tia_prob:
            if big:
                img = tia_distort(img, random.randint(3, 6))
                img = tia_stretch(img, random.randint(3, 6))
            img = tia_perspective(img)
        if random.random() <= self.crop_prob and big:
            img = crop_top_or_bottom(img)
        if random.random() <= self.blur_prob:
            img = gaussian_blur(img)
        if random.random() <= self.hsv_aug_prob:
            img = hsv_value_scale(img)
        if random.random() <= self.jitter_prob:
            img = shift_jitter(img)
        if random.random() <= self.noise_prob:
            img = gaussian_noise(img)
        if random.random() <= self.reverse_prob:
            img = 255 - img
        data["image"] = img
        return data


# ----------------------------------------------------------------------------- labels
def encode_text(
    text: str, index: Dict[str, int], max_text_length: int, lower: bool
) -> Tuple[List[int], List[str]]:
    """PaddleOCR's text encoding: the indices of ``text``'s characters in ``index`` (lower-cased
    first when ``lower``) and the characters dropped (not in it); ``RejectedSample`` with the
    reason for an empty text, one longer than ``max_text_length`` or one with no known character."""
    if len(text) == 0:
        raise RejectedSample("empty label")
    if len(text) > max_text_length:
        raise RejectedSample(
            f"label longer than Global.max_text_length {max_text_length} ({len(text)}: {text[:40]!r})"
        )
    if lower:
        text = text.lower()
    ids = [index[ch] for ch in text if ch in index]
    dropped = [ch for ch in text if ch not in index]
    if not ids:
        raise RejectedSample(f"no character of label {text[:40]!r} is in the dictionary")
    return ids, dropped


def note_dropped(data: Sample, dropped: List[str]) -> None:
    """Say in ``data`` which characters of its label the dictionary does not have (if any)."""
    if dropped:
        add_note(
            data,
            f"label {data['label'][:40]!r}: {len(dropped)} character(s) not in the dictionary dropped "
            f"({''.join(sorted(set(dropped)))[:20]!r})",
        )


@TRANSFORMS.register
class CTCLabelEncode:
    """Encode ``data["label"]`` (str) for CTC: indices 1..N into the dictionary, 0 = blank/pad.

    Adds ``label`` (int64, zero-padded to ``max_text_length``), ``length`` (int64 scalar) and
    ``label_ace`` (int64 count of each class over the padded label, blank included). Without a
    dictionary the text is lower-cased; characters outside the dictionary are dropped, as in
    PaddleOCR, and the sample says which (a note reported with its origin). An empty text, one
    longer than ``max_text_length`` or one with no character of the dictionary is rejected with
    that reason. A character the dictionary holds twice (e.g. the space of ``en_dict.txt`` with
    ``use_space_char``) gets its last index, as in PaddleOCR.
    """

    def __init__(
        self, max_text_length: int, character_dict_path: Optional[str] = None, use_space_char: bool = False
    ) -> None:
        if max_text_length < 1:
            raise ConfigError(f"Global.max_text_length must be positive, got {max_text_length}")
        self.max_text_length = max_text_length
        self.lower = not character_dict_path
        self.character = ["blank"] + load_characters(character_dict_path, use_space_char)
        # a duplicated dictionary entry gets its last index (PaddleOCR's dict building)
        self.index = {ch: i for i, ch in enumerate(self.character[1:], start=1)}

    def encode(self, text: str) -> Optional[List[int]]:
        """Class indices of ``text``, or ``None`` when it cannot be used."""
        try:
            return self.checked_encode(text)[0]
        except RejectedSample:
            return None

    def checked_encode(self, text: str) -> Tuple[List[int], List[str]]:
        """Class indices of ``text`` and the characters dropped (not in the dictionary);
        ``RejectedSample`` with the reason when it cannot be used."""
        return encode_text(text, self.index, self.max_text_length, self.lower)

    def __call__(self, data: Sample) -> Optional[Sample]:
        ids, dropped = self.checked_encode(data["label"])
        note_dropped(data, dropped)
        label = np.zeros(self.max_text_length, dtype=np.int64)
        label[: len(ids)] = ids
        data["length"] = np.array(len(ids), dtype=np.int64)
        data["label"] = label
        data["label_ace"] = np.bincount(label, minlength=len(self.character)).astype(np.int64)
        return data


# ----------------------------------------------------------------------------- resize
def _to_channels(img: np.ndarray, channels: int) -> np.ndarray:
    """(H, W, channels) for 3 channels, (H, W) for 1 channel."""
    if channels == 1:
        if img.ndim == 3:
            return cv2.cvtColor(img, cv2.COLOR_BGR2GRAY) if img.shape[2] == 3 else img[:, :, 0]
        return img
    if img.ndim == 2:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    if img.shape[2] == 1:
        return np.repeat(img, 3, axis=2)
    return img


RESIZE_NORM_MEAN = 0.5  # RecResizeImg's normalisation of [0, 1] pixels: (x - mean) / std
RESIZE_NORM_STD = 0.5


def resize_norm(
    img: np.ndarray, image_shape: List[int], padding: bool = True, variable_width: bool = False
) -> tuple:
    """Resize to height ``imgH``, normalise to [-1, 1], right-pad with zeros to the target width.

    Returns ``(chw_float32, valid_ratio)`` (the share of the width the image fills: a float32
    scalar array, so a batch gets a float32 vector). ``variable_width`` widens the target to the
    image's own aspect ratio when it is wider than ``imgW / imgH``.
    """
    channels, img_h, img_w = image_shape
    h, w = img.shape[:2]
    ratio = w / float(h)
    if variable_width:
        img_w = int(img_h * max(img_w / img_h, ratio))
    if padding or variable_width:
        resized_w = min(img_w, int(math.ceil(img_h * ratio)))
    else:
        resized_w = img_w
    resized_w = max(resized_w, 1)
    resized = cv2.resize(_to_channels(img, channels), (resized_w, img_h), interpolation=cv2.INTER_LINEAR)
    resized = resized.astype(np.float32)
    resized = resized[None] if resized.ndim == 2 else resized.transpose(2, 0, 1)
    resized = (resized / 255.0 - RESIZE_NORM_MEAN) / RESIZE_NORM_STD
    out = np.zeros((channels, img_h, img_w), dtype=np.float32)
    out[:, :, :resized_w] = resized
    return out, np.array(min(1.0, resized_w / float(img_w)), dtype=np.float32)


@TRANSFORMS.register
class RecResizeImg:
    """Resize a text line to ``image_shape`` = [C, H, W] (CHW float32 in [-1, 1]) + ``valid_ratio``.

    ``padding`` keeps the aspect ratio and zero-pads on the right (False stretches to W).
    ``eval_mode``, or ``infer_mode`` with a dictionary, keeps wide images wide (variable width).
    """

    def __init__(
        self,
        image_shape: List[int],
        infer_mode: bool = False,
        eval_mode: bool = False,
        character_dict_path: Optional[str] = None,
        padding: bool = True,
    ) -> None:
        if len(image_shape) != 3 or image_shape[0] not in (1, 3) or min(image_shape) < 1:
            raise ConfigError(f"RecResizeImg.image_shape must be [C, H, W] with C 1 or 3, got {image_shape}")
        self.image_shape = [int(v) for v in image_shape]
        self.variable_width = bool(eval_mode or (infer_mode and character_dict_path is not None))
        self.padding = padding

    def __call__(self, data: Sample) -> Sample:
        img = data["image"]
        if not isinstance(img, np.ndarray) or img.ndim not in (2, 3) or min(img.shape[:2]) < 1:
            raise TypeError(
                "RecResizeImg expects a decoded (H, W[, C]) image (DecodeImage with channel_first False)"
            )
        data["image"], data["valid_ratio"] = resize_norm(
            img, self.image_shape, self.padding, self.variable_width
        )
        return data
