"""PaddleDetection's ``PadBatch``: images of different sizes (``RandomResize`` / keep-ratio
``Resize``) joined into one batch.

It runs after ``NormalizeImage`` and ``Permute`` (CHW float32), as in PaddleDetection, so the
padding is 0 in the normalised image; a pipeline that ends with it therefore normalises on the
host (``device_transforms.defer_to_device`` stops at an op without device steps). ``im_shape``
stays each image's own size, which the model and the post-process use to clip boxes.
"""

from __future__ import annotations

from typing import List

import numpy as np

from ppdist.data.transforms.det import Sample
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS


@TRANSFORMS.register
class PadBatch:
    """Pad every image of a batch (bottom / right, zeros) to the batch's largest height and width,
    each rounded up to a multiple of ``pad_to_stride`` when it is > 0 (0 or -1: not rounded)."""

    batch_op = True

    def __init__(self, pad_to_stride: int = 0) -> None:
        if isinstance(pad_to_stride, bool) or not isinstance(pad_to_stride, int):
            raise ConfigError(
                f"PadBatch.pad_to_stride must be an int (<= 0: no rounding), got {pad_to_stride!r}"
            )
        self.stride = max(0, pad_to_stride)  # faster_reader.yml's -1, like 0: the largest size as is

    def padded_hw(self, samples: List[Sample]) -> tuple:
        """The (height, width) every image of ``samples`` is padded to."""
        height = max(int(s["image"].shape[1]) for s in samples)
        width = max(int(s["image"].shape[2]) for s in samples)
        if self.stride > 0:
            height = -(-height // self.stride) * self.stride
            width = -(-width // self.stride) * self.stride
        return height, width

    def __call__(self, samples: List[Sample]) -> List[Sample]:
        for sample in samples:
            image = sample.get("image")
            if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[0] not in (1, 3):
                raise ConfigError(
                    "PadBatch expects CHW images: put NormalizeImage and Permute before it "
                    f"(got {getattr(image, 'shape', type(image).__name__)})"
                )
        height, width = self.padded_hw(samples)
        for sample in samples:
            image = sample["image"]
            padded = np.zeros((image.shape[0], height, width), dtype=np.float32)
            padded[:, : image.shape[1], : image.shape[2]] = image
            sample["image"] = padded
        return samples
