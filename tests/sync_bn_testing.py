"""Test helpers of the SyncBatchNorm tests (CPU and CUDA): a seeded BatchNorm, each rank's input
and upstream gradient, one forward + backward; and torch's own SyncBatchNorm on CPU tensors, for
comparisons with ppdist's.

torch's ``nn.SyncBatchNorm`` refuses CPU inputs and its kernels (``batch_norm_stats``, ...) exist
for accelerators only. Inside ``TorchKernelsOnCpu`` those kernels are ppdist's CPU arithmetic and
its device check takes the CPU for an accelerator, so torch's own forward/backward (masks, host
reads and all) runs on a gloo group.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple
from unittest import mock

import torch
from torch import nn

from ppdist.modeling import sync_batch_norm as sbn


def make_batch_norm(shape: Sequence[int]) -> nn.Module:
    """A training BatchNorm (2d for 4-d ``shape``, else 1d) over ``shape[1]`` channels with seeded
    affine parameters and running statistics."""
    module = (nn.BatchNorm2d if len(shape) == 4 else nn.BatchNorm1d)(shape[1], momentum=0.1)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        module.weight.copy_(torch.rand(shape[1], generator=generator) + 0.5)
        module.bias.copy_(torch.randn(shape[1], generator=generator))
        module.running_mean.copy_(torch.randn(shape[1], generator=generator))
        module.running_var.copy_(torch.rand(shape[1], generator=generator) + 0.5)
    return module.train()


def rank_data(
    shapes: Sequence[Sequence[int]], channels_last: bool, rank: int, device: str = "cpu"
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s input and upstream gradient (the same on every process that asks)."""
    generator = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(shapes[rank], generator=generator) * 3 + 1
    grad = torch.randn(shapes[rank], generator=generator)
    x, grad = x.to(device), grad.to(device)
    if channels_last:
        x, grad = (t.contiguous(memory_format=torch.channels_last) for t in (x, grad))
    return x, grad


def run(module: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Forward + backward of ``module`` on ``x``; what it produced and kept."""
    x = x.clone().requires_grad_(True)
    y = module(x)
    y.backward(grad)
    return {
        "y": y.detach(),
        "x_grad": x.grad,
        "weight_grad": module.weight.grad.clone(),
        "bias_grad": module.bias.grad.clone(),
        "running_mean": module.running_mean.clone(),
        "running_var": module.running_var.clone(),
        "num_batches_tracked": module.num_batches_tracked.clone(),
    }


class TorchKernelsOnCpu:
    """``with TorchKernelsOnCpu(): torch_sync_bn(x)`` on CPU tensors."""

    def __enter__(self) -> "TorchKernelsOnCpu":
        self.patches: List[Any] = [
            mock.patch.object(torch, "batch_norm_stats", sbn.cpu_stats),
            mock.patch.object(torch, "batch_norm_gather_stats_with_counts", sbn.cpu_gather_stats_with_counts),
            mock.patch.object(torch, "batch_norm_elemt", sbn.cpu_elemt),
            mock.patch.object(torch, "batch_norm_backward_reduce", sbn.cpu_backward_reduce),
            mock.patch.object(torch, "batch_norm_backward_elemt", sbn.cpu_backward_elemt),
            mock.patch.object(torch._C, "_get_privateuse1_backend_name", lambda: "cpu"),
        ]
        for patch in self.patches:
            patch.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for patch in reversed(self.patches):
            patch.stop()
