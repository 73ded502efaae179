"""Segmentation inference and post-processing: PaddleSeg's ``test_config`` options.

``infer(model, batch)`` runs the model on ``batch["image"]``: whole image, or sliding
windows (``is_slide``, ``crop_size`` / ``stride`` as (w, h)); with ``aug_eval``, at each
of ``scales`` and flips, averaging the logits resized to the input size. ``__call__``
resizes the logits (bilinear) to the label's size when they differ — eval labels stay at
full resolution — and takes the argmax.
"""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.registry import POSTPROCESSES

Scales = Union[float, List[float]]


def _pair(value: Optional[Sequence[int]], key: str) -> Optional[Tuple[int, int]]:
    if value is None:
        return None
    if isinstance(value, int):
        return value, value
    if len(value) != 2 or not all(isinstance(v, int) and v > 0 for v in value):
        raise ValueError(f"{key} must be [w, h] positive integers, got {value!r}")
    return int(value[0]), int(value[1])


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
        self.scales = [float(scales)] if isinstance(scales, (int, float)) else [float(s) for s in scales]
        if not self.scales or any(s <= 0 for s in self.scales):
            raise ValueError(f"scales must be positive numbers, got {scales!r}")
        self.aug_eval = aug_eval
        self.flips = (
            [(False, False)]
            + [(True, False)] * flip_horizontal
            + [(False, True)] * flip_vertical
            + [(True, True)] * (flip_horizontal and flip_vertical)
        )
        self.is_slide = is_slide
        self.crop_size = _pair(crop_size, "crop_size")
        self.stride = _pair(stride, "stride")
        if is_slide and (self.crop_size is None or self.stride is None):
            raise ValueError("is_slide needs crop_size and stride ([w, h])")

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
        if bool((count == 0).any()):
            raise RuntimeError(
                "sliding-window inference left pixels unpredicted: stride is larger than crop_size"
            )
        return total / count

    def infer(self, model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        """Logits ``[N, C, H, W]`` at the size of ``batch["image"]``."""
        image = batch["image"] if isinstance(batch, Mapping) else batch
        if not self.aug_eval:
            return self._forward(model, image).float()
        h, w = image.shape[-2:]
        total: Any = 0.0
        for scale in self.scales:
            scaled = _resize(image, (int(h * scale + 0.5), int(w * scale + 0.5)))
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
