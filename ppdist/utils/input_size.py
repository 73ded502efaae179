"""Whether an image is smaller than a model's smallest input, and the words that say so (the
minimum comes from ``ppdist.modeling.input_size.min_input_size``; the data path and the inference
runners use these)."""

from __future__ import annotations

from typing import Optional, Sequence


def too_small(size: Sequence[int], minimum: Optional[Sequence[int]]) -> bool:
    """Whether an image of ``size`` (height, width) is under ``minimum`` on either axis."""
    return minimum is not None and (int(size[0]) < int(minimum[0]) or int(size[1]) < int(minimum[1]))


def describe_too_small(size: Sequence[int], minimum: Sequence[int], after: str) -> str:
    """The reason an image of ``size`` cannot go through a model whose smallest input is ``minimum``."""
    return (
        f"the image is {int(size[0])}x{int(size[1])} (HxW) {after}, smaller than the model's smallest "
        f"input {int(minimum[0])}x{int(minimum[1])}; resize it in the transforms or leave it out"
    )
