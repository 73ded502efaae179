"""Index ranges made from a tensor, so that a traced graph records no device."""

from __future__ import annotations

from typing import Union

import torch

Length = Union[int, torch.Tensor]  # a traced size is a 0-d tensor


def index_range(length: Length, like: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``arange(length)`` on ``like``'s device, as ``like.new_ones(length).cumsum(0) - 1``.

    ``torch.arange(n, device=x.device)`` traced on the CPU records the constant device "cpu",
    which a TorchScript file loaded onto a GPU keeps; ``new_ones`` records none (it follows
    ``like`` at run time), and a traced ``length`` stays dynamic. Exact for float32 up to 2**24.
    """
    return like.new_ones(length, dtype=dtype).cumsum(0) - 1
