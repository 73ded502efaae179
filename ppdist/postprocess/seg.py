"""Segmentation inference and post-processing: PaddleSeg's ``test_config`` options.

``infer(model, batch)`` runs the model on ``batch["image"]``: whole image, or sliding
windows (``is_slide``, ``crop_size`` / ``stride`` as (w, h)); with ``aug_eval``, at each
of ``scales`` and flips, averaging the logits resized to the input size (no softmax), as
PaddleSeg's ``core/infer.py`` (``slide_inference``, ``aug_inference``) does. ``__call__``
resizes the logits (bilinear) to the label's size when they differ — eval labels stay at
full resolution, as PaddleSeg's ``trans_info`` resize back — and takes the argmax.
"""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.errors import ConfigError
from ppdist.modeling.input_size import min_input_size
from ppdist.registry import POSTPROCESSES
from ppdist.utils.input_size import too_small

Scales = Union[float, List[float]]


def _is_pair(value: Any) -> bool:
    """Two positive integers, as PaddleSeg's ``w, h = value`` takes them."""
    return (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    )


def check_test_time_options(options: Mapping[str, Any], where: str = "PostProcess") -> None:
    """Raise one ``ConfigError`` naming the key when PaddleSeg's ``test_config`` values cannot work:
    ``scales`` not positive, ``crop_size`` / ``stride`` not [w, h] integers, ``is_slide`` without
    them, or a stride longer than the window (pixels between windows would get no prediction)."""
    scales = options.get("scales", 1.0)
    values = scales if isinstance(scales, (list, tuple)) else [scales]
    if not values or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values
    ):
        raise ConfigError(
            f"{where}.scales must be a positive number or a non-empty list of them, got {scales!r}"
        )
    for key in ("crop_size", "stride"):
        value = options.get(key)
        if value is not None and not _is_pair(value):
            raise ConfigError(f"{where}.{key} must be [w, h], two positive integers, got {value!r}")
    crop, stride = options.get("crop_size"), options.get("stride")
    if options.get("is_slide"):
        for key, value, what in (
            ("crop_size", crop, "window size"),
            ("stride", stride, "step between windows"),
        ):
            if value is None:
                raise ConfigError(f"{where}.is_slide: true needs {where}.{key}, the [w, h] {what}")
    if crop is not None and stride is not None and (stride[0] > crop[0] or stride[1] > crop[1]):
        raise ConfigError(
            f"{where}.stride {list(stride)} must not exceed {where}.crop_size {list(crop)} in width or height: "
            "the pixels between two windows would get no prediction"
        )


def _resize(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=list(size), mode="bilinear", align_corners=False)


def _flip(x: torch.Tensor, horizontal: bool, vertical: bool) -> torch.Tensor:
    dims = [d for d, on in ((3, horizontal), (2, vertical)) if on]
    return x.flip(dims) if dims else x


def first_output(preds: Any) -> torch.Tensor:
    return preds[0] if isinstance(preds, (list, tuple)) else preds


@POSTPROCESSES.register
class SegPostProcess:
    """Test-time options (PaddleSeg's ``test_config``) and the argmax to class ids."""

    def __init__(
        self,
        aug_eval: bool = False,
        scales: Scales = 1.0,
        flip_horizontal: bool = False,
        flip_vertical: bool = False,
        is_slide: bool = False,
        crop_size: Optional[List[int]] = None,
        stride: Optional[List[int]] = None,
    ) -> None:
        check_test_time_options(
            {"scales": scales, "is_slide": is_slide, "crop_size": crop_size, "stride": stride}
        )
        self.scales = [float(scales)] if isinstance(scales, (int, float)) else [float(s) for s in scales]
        self.aug_eval = aug_eval
        self.flips = (  # PaddleSeg's flip_combination, in its order
            [(False, False)]
            + [(True, False)] * flip_horizontal
            + [(False, True)] * flip_vertical
            + [(True, True)] * (flip_horizontal and flip_vertical)
        )
        self.is_slide = is_slide
        self.crop_size: Optional[Tuple[int, int]] = (crop_size[0], crop_size[1]) if crop_size else None
        self.stride: Optional[Tuple[int, int]] = (stride[0], stride[1]) if stride else None

    @staticmethod
    def check_values(options: Mapping[str, Any], where: str) -> None:
        """Config validation: the values ``__init__`` would refuse, as one ``ConfigError``."""
        check_test_time_options(options, where)

    def _forward(self, model: nn.Module, image: torch.Tensor) -> torch.Tensor:
        return self._slide(model, image) if self.is_slide else first_output(model(image))

    def _slide(self, model: nn.Module, image: torch.Tensor) -> torch.Tensor:
        """Windows of ``crop_size`` every ``stride``; the last window is moved back inside the
        image and overlapping logits are averaged."""
        assert self.crop_size is not None and self.stride is not None
        h_im, w_im = image.shape[-2:]
        (w_crop, h_crop), (w_stride, h_stride) = self.crop_size, self.stride
        rows = 1 if h_im <= h_crop else math.ceil((h_im - h_crop) / h_stride) + 1
        cols = 1 if w_im <= w_crop else math.ceil((w_im - w_crop) / w_stride) + 1
        total: Optional[torch.Tensor] = None
        count = torch.zeros((1, 1, h_im, w_im), device=image.device)
        for r in range(rows):
            for c in range(cols):
                h2, w2 = min(r * h_stride + h_crop, h_im), min(c * w_stride + w_crop, w_im)
                h1, w1 = max(h2 - h_crop, 0), max(w2 - w_crop, 0)
                logit = first_output(model(image[:, :, h1:h2, w1:w2])).float()
                if total is None:
                    total = torch.zeros((image.shape[0], logit.shape[1], h_im, w_im), device=image.device)
                total[:, :, h1:h2, w1:w2] += logit[:, :, : h2 - h1, : w2 - w1]
                count[:, :, h1:h2, w1:w2] += 1
        # every pixel is covered (stride <= crop_size, checked with the config; the last window ends
        # at the border), so no count is 0: nothing to read back on the host
        assert total is not None
        return total / count

    def infer(self, model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        """Logits ``[N, C, H, W]`` at the size of ``batch["image"]``."""
        image = batch["image"] if isinstance(batch, Mapping) else batch
        if not self.aug_eval:
            return self._forward(model, image).float()
        h, w = image.shape[-2:]
        smallest = min_input_size(model) or (1, 1)
        total: Any = 0.0
        for scale in self.scales:
            size = (int(h * scale + 0.5), int(w * scale + 0.5))
            if too_small(size, smallest):
                least = max((smallest[0] - 0.5) / h, (smallest[1] - 0.5) / w)
                raise ConfigError(
                    f"PostProcess.scales (--scales): scale {scale:g} makes the {h}x{w} input "
                    f"{size[0]}x{size[1]} pixels, under the model's smallest input "
                    f"{smallest[0]}x{smallest[1]}; use scales of at least {least:.3g} for it"
                )
            scaled = _resize(image, size)
            for horizontal, vertical in self.flips:
                logit = self._forward(model, _flip(scaled, horizontal, vertical)).float()
                total = total + _resize(_flip(logit, horizontal, vertical), (h, w))
        return total / (len(self.scales) * len(self.flips))

    def logits_at_label_size(self, preds: Any, batch: Mapping[str, Any]) -> torch.Tensor:
        logit = first_output(preds).float()
        label = batch.get("label") if isinstance(batch, Mapping) else None
        return logit if label is None else _resize(logit, label.shape[-2:])

    def __call__(self, preds: Any, batch: Mapping[str, Any]) -> torch.Tensor:
        """Class ids ``[N, H, W]`` (int64) at the label's resolution."""
        return self.logits_at_label_size(preds, batch).argmax(1)
