"""Extra samples a transform joins to each sample (RecConAug), loaded by the dataset as PaddleOCR's
SimpleDataSet / LMDBDataSet do: ``ext_data_num`` random samples of the same data set, each read and
put through the first ``ext_op_transform_idx`` transforms, under ``data["ext_data"]``.

The indices are drawn from ``np.random``, which the dataset seeds per (seed, epoch, index) before
it loads a sample: the extra samples are the same whatever the worker count, the process count
or where a run was resumed.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ppdist.data.base import RejectedSample, apply_transforms
from ppdist.errors import ConfigError

EXT_DATA_KEY = "ext_data"
MAX_TRIES_PER_SAMPLE = 20  # draws allowed per extra sample before the sample itself is given up


def ext_data_num(ops: Sequence[Any]) -> Optional[int]:
    """How many extra samples the pipeline wants: the ``ext_data_num`` of its first op that has one
    (None when no op joins extra samples)."""
    for op in ops:
        if hasattr(op, "ext_data_num"):
            return int(op.ext_data_num)
    return None


def check_ext_op_transform_idx(ops: Sequence[Any], ext_op_transform_idx: Any, where: str) -> int:
    """``ext_op_transform_idx`` as an int, or ConfigError when it is not a count of transforms or
    when the extra samples would go through the op that joins them."""
    if (
        isinstance(ext_op_transform_idx, bool)
        or not isinstance(ext_op_transform_idx, int)
        or ext_op_transform_idx < 0
    ):
        raise ConfigError(
            f"{where}.ext_op_transform_idx must be a number of transforms (0 or more), got {ext_op_transform_idx!r}"
        )
    for position, op in enumerate(ops[:ext_op_transform_idx]):
        if hasattr(op, "ext_data_num"):
            raise ConfigError(
                f"{where}.ext_op_transform_idx {ext_op_transform_idx} puts the extra samples through "
                f"{type(op).__name__} (transform {position}), which joins them: use {position} or less"
            )
    return ext_op_transform_idx


def load_ext_data(
    count: int, size: int, read: Callable[[int], Dict[str, Any]], ops: Sequence[Any]
) -> List[Dict[str, Any]]:
    """``count`` samples of random indices below ``size``, each ``read`` and through ``ops``; one
    that fails is replaced by another draw (``RejectedSample`` past ``MAX_TRIES_PER_SAMPLE`` each)."""
    samples: List[Dict[str, Any]] = []
    tries = 0
    while len(samples) < count:
        tries += 1
        if tries > MAX_TRIES_PER_SAMPLE * count:
            raise RejectedSample(f"no usable extra sample for RecConAug in {tries - 1} random draws")
        index = int(np.random.randint(size))
        try:
            data = apply_transforms(ops, read(index))
        except Exception:  # an unreadable extra sample is skipped, as PaddleOCR does
            continue
        if data is not None:
            samples.append(data)
    return samples


class ExtDataMixin:
    """For a ``BaseDataSet`` (put it first among the bases): a sample read gets ``ext_data`` when
    one of the dataset's ops joins extra samples (``ext_data_num``), the others read alike and put
    through ``ops[:ext_op_transform_idx]`` (set ``ext_op_transform_idx`` in ``__init__``)."""

    ext_op_transform_idx: int
    ops: List[Any]

    def add_ext_data(self, data: Dict[str, Any]) -> None:
        count = ext_data_num(self.ops)
        if count is not None:
            ext_ops = self.ops[: self.ext_op_transform_idx]
            data[EXT_DATA_KEY] = load_ext_data(count, len(self), self.read, ext_ops)  # type: ignore[attr-defined]
