"""Test helper: torch's own SyncBatchNorm on CPU tensors, for comparisons with ppdist's.

torch's ``nn.SyncBatchNorm`` refuses CPU inputs and its kernels (``batch_norm_stats``, ...) exist
for accelerators only. Inside ``TorchKernelsOnCpu`` those kernels are ppdist's CPU arithmetic and
its device check takes the CPU for an accelerator, so torch's own forward/backward (masks, host
reads and all) runs on a gloo group.
"""

from __future__ import annotations

from typing import Any, List
from unittest import mock

import torch

from ppdist.modeling import sync_batch_norm as sbn


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
