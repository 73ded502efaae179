"""Index ranges, sizes and orders made from tensors, so that a traced graph (TorchScript, ONNX)
records no device and keeps its sizes dynamic."""

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


def size_of(length: Length, like: torch.Tensor) -> torch.Tensor:
    """``length`` as a 0-d tensor of ``like``'s dtype and device (a traced size stays dynamic and
    records no device; exact for float32 up to 2**24)."""
    return like.new_ones(length).sum()


def at_most(size: Length, limit: int) -> Length:
    """``min(size, limit)``; a traced size (a 0-d tensor) stays a tensor, so the graph stays dynamic."""
    return size.clamp(max=limit) if isinstance(size, torch.Tensor) else min(size, limit)


def is_graph_capture() -> bool:
    """Whether a TorchScript trace or an ONNX export is recording this call: code with host reads
    (data-dependent Python loops) must take its tensor-only form there."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


def best_first(values: torch.Tensor, k: Length) -> torch.Tensor:
    """Indices of the ``k`` largest of each row of ``values`` [B, N], best first, equal values in
    index order: a stable descending argsort (also in a TorchScript trace); in an ONNX export
    ``topk``, whose ONNX operator breaks ties by the lower index (ONNX has no stable sort)."""
    if torch.onnx.is_in_onnx_export():
        return torch.topk(values, k, dim=1, largest=True, sorted=True).indices
    return torch.argsort(values, dim=1, descending=True, stable=True)[:, :k]


def kept_first(keep: torch.Tensor) -> torch.Tensor:
    """[B, N] indices that put each row's kept entries first, in order, then the others in order
    (a stable sort of ``~keep`` without a sort: positions by running counts, one scatter)."""
    kept = keep.long()
    dropped = 1 - kept
    count = kept.sum(dim=1, keepdim=True)
    position = torch.where(keep, kept.cumsum(1) - 1, count + dropped.cumsum(1) - 1)
    columns = index_range(keep.shape[1], keep).unsqueeze(0).expand_as(position)
    return torch.empty_like(position).scatter(1, position, columns)
