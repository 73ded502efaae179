"""The smallest image a model accepts.

A component that sees the network's input and cannot take any size (SegFormer's MiT: its first
stage's keys and values come from an 8x8 stride-8 convolution of the 1/4-scale tokens, so an image
under 29 pixels has no such patch) declares ``min_input_size``: a ``(height, width)`` tuple in
input pixels. ``min_input_size(model)`` is the largest declaration in a model (also through DDP,
``torch.compile``, EMA copies or a distillation model's sub-models), or None when nothing
declares one. The data path and the inference runners consult it to name an image that is too
small (a bad sample in evaluation, a skipped file in inference) instead of failing inside torch.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

from torch import nn

Size = Tuple[int, int]
LARGEST_SEARCHED = 1 << 16  # no model here needs more; beyond it the declaration is a bug


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """A convolution's output length along one axis (no dilation); < 1 means it cannot run."""
    return (size + 2 * padding - kernel) // stride + 1


def smallest_accepted(accepts: Callable[[int], bool]) -> int:
    """The smallest positive length ``accepts`` takes (``accepts`` is monotone in the length)."""
    for size in range(1, LARGEST_SEARCHED + 1):
        if accepts(size):
            return size
    raise ValueError(f"no input length up to {LARGEST_SEARCHED} is accepted")


def min_input_size(model: object) -> Optional[Size]:
    """The largest ``min_input_size`` any module of ``model`` declares, per axis; None if none does
    (or ``model`` is no module, e.g. an exported graph's run function)."""
    if not isinstance(model, nn.Module):  # e.g. an inference backend's function
        return None
    declared = [
        size
        for module in model.modules()
        if isinstance(size := getattr(module, "min_input_size", None), tuple)
    ]
    if not declared:
        return None
    return max(h for h, _ in declared), max(w for _, w in declared)
