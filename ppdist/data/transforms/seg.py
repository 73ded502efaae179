"""Semantic-segmentation transforms (PaddleSeg semantics).

A sample holds ``image`` (H, W[, C] uint8 or float32, RGB), optionally ``label`` (H, W
integer class ids) and ``gt_fields``: the keys that follow every geometric op of the image.
Labels are always resized with nearest-neighbour interpolation. Randomness comes from
``random`` / ``np.random`` (seeded per sample by the dataset).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

import cv2
import numpy as np

import ppdist.data.transforms.photometric as photometric
from ppdist.data.pending_image import materialize
from ppdist.data.transforms.det import resize_detection
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS

Sample = Dict[str, Any]

INTERPOLATIONS = {
    "NEAREST": cv2.INTER_NEAREST,
    "LINEAR": cv2.INTER_LINEAR,
    "CUBIC": cv2.INTER_CUBIC,
    "AREA": cv2.INTER_AREA,
    "LANCZOS4": cv2.INTER_LANCZOS4,
}
_CV_NEAREST_DTYPES = (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.float32, np.float64)


# ----------------------------------------------------------------------------- helpers
def _size_pair(value: Any, where: str) -> Tuple[int, int]:
    """``[w, h]`` as two positive ints, else a ConfigError naming ``where``."""
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ConfigError(f"{where} must be [width, height] (two positive ints), got {value!r}")
    return int(value[0]), int(value[1])


def _check_prob(value: float, where: str) -> float:
    if not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{where} must lie in [0, 1], got {value!r}")
    return float(value)


def _check_nonneg(value: float, where: str) -> float:
    if float(value) < 0:
        raise ConfigError(f"{where} must be >= 0, got {value!r}")
    return float(value)


def gt_keys(data: Sample) -> List[str]:
    """The keys of ``gt_fields`` that are present in the sample."""
    return [k for k in data.get("gt_fields", []) if k in data]


def _image(data: Sample, op: str) -> np.ndarray:
    img = materialize(data).get("image")  # a detection sample's pending geometry drawn
    if not isinstance(img, np.ndarray) or img.ndim not in (2, 3):
        raise TypeError(f"{op} expects a decoded (H, W[, C]) image array in data['image']")
    return img


_CV_FLIP_DTYPES = (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.float32, np.float64)


def flip(arr: np.ndarray, axis: int) -> np.ndarray:
    """``arr`` mirrored along ``axis`` (0 or 1), a new contiguous array (cv2 where it can)."""
    if arr.dtype.type in _CV_FLIP_DTYPES and arr.ndim in (2, 3) and (arr.ndim == 2 or arr.shape[2] <= 4):
        return cv2.flip(arr, 1 if axis == 1 else 0)
    return np.ascontiguousarray(np.flip(arr, axis=axis))


def resize_nearest(label: np.ndarray, width: int, height: int) -> np.ndarray:
    """cv2 nearest-neighbour resize for any dtype (index gather where cv2 lacks the type)."""
    if label.dtype.type in _CV_NEAREST_DTYPES:
        return cv2.resize(label, (width, height), interpolation=cv2.INTER_NEAREST)
    rows = np.minimum((np.arange(height) * (label.shape[0] / height)).astype(np.int64), label.shape[0] - 1)
    cols = np.minimum((np.arange(width) * (label.shape[1] / width)).astype(np.int64), label.shape[1] - 1)
    return label[rows[:, None], cols[None, :]]


def _resize_all(data: Sample, width: int, height: int, interp: int) -> Sample:
    """Resize the image with ``interp`` and every gt field with nearest neighbour."""
    data["image"] = cv2.resize(data["image"], (width, height), interpolation=interp)
    for key in gt_keys(data):
        data[key] = resize_nearest(data[key], width, height)
    return data


# ----------------------------------------------------------------------------- geometry
@TRANSFORMS.register
class ResizeStepScaling:
    """Rescale by a factor drawn from ``linspace(min, max, int((max - min) / step + 1))``.

    ``scale_step_size`` 0 draws the factor uniformly from [min, max]. New size is
    ``round(s * W) x round(s * H)``; image bilinear, gt fields nearest.
    """

    def __init__(
        self, min_scale_factor: float = 0.75, max_scale_factor: float = 1.25, scale_step_size: float = 0.25
    ) -> None:
        if not 0 < min_scale_factor <= max_scale_factor:
            raise ConfigError(
                "ResizeStepScaling: need 0 < min_scale_factor <= max_scale_factor, got "
                f"min_scale_factor={min_scale_factor}, max_scale_factor={max_scale_factor}"
            )
        self.min_scale = float(min_scale_factor)
        self.max_scale = float(max_scale_factor)
        self.step = _check_nonneg(scale_step_size, "ResizeStepScaling.scale_step_size")

    def draw_scale(self) -> float:
        """One random scale factor."""
        if self.min_scale == self.max_scale:
            return self.min_scale
        if self.step == 0:
            return float(np.random.uniform(self.min_scale, self.max_scale))
        count = int((self.max_scale - self.min_scale) / self.step + 1)
        factors = np.linspace(self.min_scale, self.max_scale, count)
        np.random.shuffle(factors)
        return float(factors[0])

    def __call__(self, data: Sample) -> Sample:
        h, w = _image(data, "ResizeStepScaling").shape[:2]
        s = self.draw_scale()
        width, height = max(1, int(round(s * w))), max(1, int(round(s * h)))
        return _resize_all(data, width, height, cv2.INTER_LINEAR)


@TRANSFORMS.register
class RandomPaddingCrop:
    """Pad bottom/right up to ``crop_size`` = [w, h] (image ``im_padding_value``, gt fields
    ``label_padding_value``), then take a uniformly random ``crop_size`` window.

    Integer images get the padding value truncated (as the reference's later uint8 cast does).
    """

    def __init__(
        self,
        crop_size: Sequence[int] = (512, 512),
        im_padding_value: float = 127.5,
        label_padding_value: int = 255,
    ) -> None:
        self.crop_w, self.crop_h = _size_pair(crop_size, "RandomPaddingCrop.crop_size")
        self.im_pad = float(im_padding_value)
        self.label_pad = int(label_padding_value)

    @staticmethod
    def _pad(arr: np.ndarray, pad_h: int, pad_w: int, value: float) -> np.ndarray:
        widths = [(0, pad_h), (0, pad_w)] + [(0, 0)] * (arr.ndim - 2)
        if np.issubdtype(arr.dtype, np.integer):
            info = np.iinfo(arr.dtype)
            value = int(min(max(value, info.min), info.max))
        return np.pad(arr, widths, mode="constant", constant_values=value)

    def __call__(self, data: Sample) -> Sample:
        h, w = _image(data, "RandomPaddingCrop").shape[:2]
        if (h, w) == (self.crop_h, self.crop_w):
            return data
        keys = gt_keys(data)
        pad_h, pad_w = max(self.crop_h - h, 0), max(self.crop_w - w, 0)
        if pad_h or pad_w:
            data["image"] = self._pad(data["image"], pad_h, pad_w, self.im_pad)
            for key in keys:
                data[key] = self._pad(data[key], pad_h, pad_w, self.label_pad)
            h, w = h + pad_h, w + pad_w
        top = np.random.randint(h - self.crop_h + 1)
        left = np.random.randint(w - self.crop_w + 1)
        window = (slice(top, top + self.crop_h), slice(left, left + self.crop_w))
        for key in ["image"] + keys:
            data[key] = np.ascontiguousarray(data[key][window])
        return data


class _RandomFlip:
    """Flip image and gt fields together along ``axis`` with probability ``prob``."""

    axis = 1

    def __init__(self, prob: float) -> None:
        self.prob = _check_prob(prob, f"{type(self).__name__}.prob")

    def __call__(self, data: Sample) -> Sample:
        _image(data, type(self).__name__)
        if random.random() < self.prob:
            for key in ["image"] + gt_keys(data):
                data[key] = flip(data[key], self.axis)
        return data


@TRANSFORMS.register
class RandomHorizontalFlip(_RandomFlip):
    """Mirror left-right with probability ``prob``."""

    axis = 1

    def __init__(self, prob: float = 0.5) -> None:
        super().__init__(prob)


@TRANSFORMS.register
class RandomVerticalFlip(_RandomFlip):
    """Mirror top-bottom with probability ``prob``."""

    axis = 0

    def __init__(self, prob: float = 0.1) -> None:
        super().__init__(prob)


@TRANSFORMS.register
class Resize:
    """Resize; one op for both suites, told apart by the sample.

    Segmentation samples (PaddleSeg): ``target_size`` = [w, h]; ``keep_ratio`` takes the
    largest size that fits, same aspect ratio; ``interp`` names the image interpolation (or
    RANDOM; cv2 codes 0-4 also work); gt fields nearest.

    Detection samples (those carrying ``im_shape``, set by ``Decode``; PaddleDetection):
    ``target_size`` is an int or [h, w]; ``interp`` a cv2 code (e.g. 2 = cubic) or a name;
    boxes, ``im_shape`` and ``scale_factor`` follow (see ``det.resize_detection``).
    """

    def __init__(
        self,
        target_size: Union[int, Sequence[int]] = (512, 512),
        keep_ratio: bool = False,
        interp: Union[int, str] = "LINEAR",
    ) -> None:
        if isinstance(target_size, int) and not isinstance(target_size, bool):
            target_size = [target_size, target_size]
        self.target_w, self.target_h = _size_pair(target_size, "Resize.target_size")
        if isinstance(interp, int) and not isinstance(interp, bool):
            names = {code: name for name, code in INTERPOLATIONS.items()}
            if interp not in names:
                raise ConfigError(
                    f"Resize.interp must be a cv2 code in 0-4, one of {', '.join(INTERPOLATIONS)} "
                    f"or RANDOM, got {interp!r}"
                )
            interp = names[interp]
        if interp != "RANDOM" and interp not in INTERPOLATIONS:
            raise ConfigError(
                f"Resize.interp must be one of {', '.join(INTERPOLATIONS)} or RANDOM "
                f"(or a cv2 code in 0-4), got {interp!r}"
            )
        self.keep_ratio = bool(keep_ratio)
        self.interp = interp

    def __call__(self, data: Sample) -> Sample:
        name = random.choice(list(INTERPOLATIONS)) if self.interp == "RANDOM" else self.interp
        if "im_shape" in data:  # a detection sample: PaddleDetection's [h, w] semantics
            # the first entry was stored as target_w: for detection it is the height
            return resize_detection(
                data, (self.target_w, self.target_h), self.keep_ratio, INTERPOLATIONS[name]
            )
        h, w = _image(data, "Resize").shape[:2]
        width, height = self.target_w, self.target_h
        if self.keep_ratio:
            scale = min(self.target_w / w, self.target_h / h)
            width, height = max(1, int(round(w * scale))), max(1, int(round(h * scale)))
        return _resize_all(data, width, height, INTERPOLATIONS[name])


# ----------------------------------------------------------------------------- photometric
@TRANSFORMS.register
class RandomDistort:
    """Brightness, contrast, saturation, hue and sharpness jitter, in a random order per image.

    Each op fires with its own probability; enhancement factors are U[1 - r, 1 + r], the hue
    shift is U[-hue_range, hue_range] steps of PIL's 8-bit HSV hue (255 per turn). The image is
    cast to uint8 first (RGB, 3 channels); the result keeps the input's dtype. PIL's formulas,
    computed with OpenCV on the array (``photometric``: brightness and contrast exact, saturation
    within 1 level, the hue rotation quantised by OpenCV's HSV instead of PIL's).

    Also PaddleDetection's ``RandomDistort``: only ``image`` is touched, and the defaults are
    its defaults (brightness, contrast, saturation U[0.5, 1.5] and hue U[-18, 18], each with
    probability 0.5, in random order; sharpness off).
    """

    def __init__(
        self,
        brightness_range: float = 0.5,
        brightness_prob: float = 0.5,
        contrast_range: float = 0.5,
        contrast_prob: float = 0.5,
        saturation_range: float = 0.5,
        saturation_prob: float = 0.5,
        hue_range: float = 18,
        hue_prob: float = 0.5,
        sharpness_range: float = 0.5,
        sharpness_prob: float = 0,
    ) -> None:
        ranges = {
            "brightness": brightness_range,
            "contrast": contrast_range,
            "saturation": saturation_range,
            "hue": hue_range,
            "sharpness": sharpness_range,
        }
        probs = {
            "brightness": brightness_prob,
            "contrast": contrast_prob,
            "saturation": saturation_prob,
            "hue": hue_prob,
            "sharpness": sharpness_prob,
        }
        self.ranges = {k: _check_nonneg(v, f"RandomDistort.{k}_range") for k, v in ranges.items()}
        self.probs = {k: _check_prob(v, f"RandomDistort.{k}_prob") for k, v in probs.items()}

    def _apply(self, name: str, img: np.ndarray) -> np.ndarray:
        r = self.ranges[name]
        if name == "hue":
            return photometric.hue(img, np.random.uniform(-r, r))
        return ENHANCERS[name](img, np.random.uniform(1 - r, 1 + r))

    def __call__(self, data: Sample) -> Sample:
        img = _image(data, "RandomDistort")
        if img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(f"RandomDistort needs an (H, W, 3) RGB image, got shape {img.shape}")
        dtype = img.dtype
        if dtype != np.uint8:
            img = np.clip(img, 0, 255).astype(np.uint8)
        img = np.ascontiguousarray(img)
        order = list(self.ranges)
        random.shuffle(order)
        for name in order:
            if np.random.uniform(0, 1) < self.probs[name]:
                img = self._apply(name, img)
        data["image"] = img if dtype == np.uint8 else img.astype(dtype)
        return data


ENHANCERS: Dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "brightness": photometric.brightness,
    "contrast": photometric.contrast,
    "saturation": photometric.saturation,
    "sharpness": photometric.sharpness,
}


@TRANSFORMS.register
class Normalize:
    """``(image / 255 - mean) / std`` per channel, as float32 (layout unchanged)."""

    def __init__(
        self, mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5)
    ) -> None:
        if (
            not isinstance(mean, (list, tuple))
            or not isinstance(std, (list, tuple))
            or len(mean) != len(std)
            or not mean
        ):
            raise ConfigError(
                f"Normalize.mean and Normalize.std must be lists of equal length, got "
                f"mean={mean!r}, std={std!r}"
            )
        if any(float(s) == 0 for s in std):
            raise ConfigError(f"Normalize.std must not contain 0, got {std!r}")
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)

    def device_steps(self) -> List[Tuple[str, Tuple[float, ...]]]:
        """The same float32 arithmetic for the device (see ``ppdist.data.device_transforms``)."""
        return [("div", (255.0,)), ("sub", tuple(self.mean.tolist())), ("div", tuple(self.std.tolist()))]

    def __call__(self, data: Sample) -> Sample:
        img = _image(data, "Normalize")
        channels = img.shape[2] if img.ndim == 3 else 1
        if channels != len(self.mean):
            raise ValueError(f"Normalize has {len(self.mean)} mean/std values for a {channels}-channel image")
        mean, std = (self.mean, self.std) if img.ndim == 3 else (self.mean[0], self.std[0])
        data["image"] = (img.astype(np.float32) / np.float32(255.0) - mean) / std
        return data
