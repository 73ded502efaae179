"""RecConAug: PP-OCRv3's concatenation of a text line with other samples of the data set, side by
side, into one longer line (PaddleOCR's semantics). The dataset loads the extra samples (see
``ppdist.data.ext_data``)."""

from __future__ import annotations

import random
from typing import Any, Dict, List, Sequence

import cv2
import numpy as np

from ppdist.data.ext_data import EXT_DATA_KEY
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS

Sample = Dict[str, Any]


def to_height(img: np.ndarray, height: int) -> np.ndarray:
    """``img`` resized (bilinear) to ``height`` rows, its width scaled alike (rounded half to even)."""
    width = round(img.shape[1] / img.shape[0] * height)
    return cv2.resize(img, (width, height))


def concat_lines(
    first: Sample, others: Sequence[Sample], height: int, max_ratio: float, max_len: int
) -> Sample:
    """``first`` with ``others`` appended to its right in turn (both scaled to ``height``, labels
    joined), stopping at the first one that would make the label longer than ``max_len`` or the
    width/height ratio larger than ``max_ratio``. A pure function of its inputs."""
    for other in others:
        if len(first["label"]) + len(other["label"]) > max_len:
            break
        img, ext = first["image"], other["image"]
        if img.shape[1] / img.shape[0] + ext.shape[1] / ext.shape[0] > max_ratio:
            break
        first["image"] = np.concatenate([to_height(img, height), to_height(ext, height)], axis=1)
        first["label"] = first["label"] + other["label"]
    return first


@TRANSFORMS.register
class RecConAug:
    """With probability ``prob``, join the sample with the ``ext_data_num`` extra samples its dataset
    loaded (decoded images and text labels, see ``ext_op_transform_idx``), as long as the label
    stays within ``max_text_length`` characters and the line within the width/height ratio of
    ``image_shape`` = [H, W, C] (H is the joined line's height).
    """

    def __init__(
        self,
        prob: float = 0.5,
        image_shape: List[int] = (32, 320, 3),
        max_text_length: int = 25,
        ext_data_num: int = 1,
    ) -> None:
        if len(image_shape) != 3 or min(image_shape[:2]) < 1:
            raise ConfigError(f"RecConAug.image_shape must be [H, W, C], got {list(image_shape)}")
        if int(ext_data_num) < 0:
            raise ConfigError(f"RecConAug.ext_data_num must be 0 or more, got {ext_data_num}")
        self.prob = prob
        self.image_shape = [int(v) for v in image_shape]
        self.max_text_length = max_text_length
        self.ext_data_num = int(ext_data_num)
        self.max_wh_ratio = self.image_shape[1] / self.image_shape[0]

    def __call__(self, data: Sample) -> Sample:
        if EXT_DATA_KEY not in data:
            raise KeyError(
                "RecConAug: the sample has no extra samples to join; RecConAug works in a SimpleDataSet "
                "or LMDBDataSet, after the transforms that decode the extra samples (ext_op_transform_idx)"
            )
        ext_data = data.pop(EXT_DATA_KEY)
        if random.random() > self.prob:
            return data
        return concat_lines(data, ext_data, self.image_shape[0], self.max_wh_ratio, self.max_text_length)
