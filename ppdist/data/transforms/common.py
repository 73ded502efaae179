"""Task-independent transforms: image decoding (PaddleOCR's ``DecodeImage``), ``NormalizeImage``
and ``Permute`` (PaddleOCR's and PaddleDetection's, also used by the table and rec pipelines), and
key selection."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import cv2
import numpy as np

from ppdist.data.image_size import DEFAULT_MAX_IMAGE_PIXELS, check_image_pixels
from ppdist.data.pending_image import materialize
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


def sample_image(data: Sample, op: str) -> np.ndarray:
    """The sample's pixels (pending geometry materialised: see ``ppdist.data.pending_image``)."""
    img = materialize(data).get("image")
    if not isinstance(img, np.ndarray) or img.ndim != 3:
        raise TypeError(f"{op} expects a decoded (H, W, C) image in data['image'] (put Decode first)")
    return img


def _scale_value(scale: Union[float, str]) -> float:
    """A number, or text such as ``1./255.`` (a number or a quotient of two), as PaddleOCR writes it."""
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        value = float(scale)
    else:
        try:
            parts = [float(p) for p in str(scale).split("/")]
            value = parts[0] / parts[1] if len(parts) == 2 else parts[0] if len(parts) == 1 else float("nan")
        except (ValueError, ZeroDivisionError):
            value = float("nan")
    if not np.isfinite(value) or value <= 0:
        raise ConfigError(
            f"NormalizeImage.scale must be a positive number or text like '1./255.', got {scale!r}"
        )
    return value


@TRANSFORMS.register
class NormalizeImage:
    """float32; ``is_scale`` multiplies by ``scale`` (1/255 unless given: a number or PaddleOCR's
    text such as ``1./255.``); ``norm_type`` "mean_std" then subtracts ``mean`` and divides by
    ``std`` per channel ("none": no mean/std). Layout unchanged: HWC, or CHW with PaddleOCR's
    ``order: chw``."""

    def __init__(
        self,
        mean: Sequence[float] = (0.485, 0.456, 0.406),
        std: Sequence[float] = (0.229, 0.224, 0.225),
        is_scale: bool = True,
        norm_type: str = "mean_std",
        scale: Union[float, str, None] = None,
        order: str = "hwc",
    ) -> None:
        if order not in ("hwc", "chw"):
            raise ConfigError(f"NormalizeImage.order must be 'hwc' or 'chw', got {order!r}")
        if norm_type not in ("mean_std", "none"):
            raise ConfigError(f"NormalizeImage.norm_type must be 'mean_std' or 'none', got {norm_type!r}")
        if not isinstance(mean, (list, tuple)) or not isinstance(std, (list, tuple)) or len(mean) != len(std):
            raise ConfigError(
                f"NormalizeImage.mean and .std must be lists of equal length, got {mean!r}, {std!r}"
            )
        if any(float(s) == 0 for s in std):
            raise ConfigError(f"NormalizeImage.std must not contain 0, got {std!r}")
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        self.is_scale = bool(is_scale)
        self.scale = np.float32(1.0 / 255.0) if scale is None else np.float32(_scale_value(scale))
        self.norm_type = norm_type
        self.order = order
        if order == "chw":  # the device steps work on the last axis: a CHW image stays on the host
            self.device_steps = None  # type: ignore[assignment]

    def device_steps(self) -> List[Tuple[str, Tuple[float, ...]]]:
        """The same float32 arithmetic for the device (see ``ppdist.data.device_transforms``)."""
        steps: List[Tuple[str, Tuple[float, ...]]] = []
        if self.is_scale:
            steps.append(("mul", (float(self.scale),)))
        if self.norm_type == "mean_std":
            steps += [("sub", tuple(self.mean.tolist())), ("div", tuple(self.std.tolist()))]
        return steps

    def __call__(self, data: Sample) -> Sample:
        img = sample_image(data, "NormalizeImage").astype(np.float32)
        if self.is_scale:
            img *= self.scale
        if self.norm_type == "mean_std":
            channels = img.shape[0] if self.order == "chw" else img.shape[2]
            if channels != len(self.mean):
                raise ValueError(
                    f"NormalizeImage has {len(self.mean)} mean/std values for a {channels}-channel image"
                )
            shape = (-1, 1, 1) if self.order == "chw" else (-1,)
            img -= self.mean.reshape(shape)
            img /= self.std.reshape(shape)
        data["image"] = img
        return data


@TRANSFORMS.register
class Permute:
    """HWC -> CHW, float32, contiguous."""

    def __init__(self) -> None:
        pass

    def device_steps(self) -> List[Tuple[str, Tuple[float, ...]]]:
        """float32 and NHWC -> NCHW on the device (see ``ppdist.data.device_transforms``)."""
        return [("to_chw", ())]

    def __call__(self, data: Sample) -> Sample:
        img = sample_image(data, "Permute")
        data["image"] = np.ascontiguousarray(img.transpose(2, 0, 1), dtype=np.float32)
        return data
