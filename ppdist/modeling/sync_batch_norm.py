"""SyncBatchNorm without host reads: batch statistics over every process of a group.

torch's ``nn.SyncBatchNorm`` drops the statistics of processes with an empty batch by indexing
the gathered statistics with a boolean mask, three times per layer: each one makes the host wait
for the device (3 host reads per BatchNorm per step, 234 for PP-YOLOE-s). Training batches are
never empty here (the samplers pad and replace bad samples), so this version gathers and combines
the statistics of every process with fixed shapes, and reads nothing on the host.

It also keeps the running variance by Paddle's rule (``biased_running_var``; see
``ppdist.modeling.batch_norm_statistics``) from the gathered counts: no collective beyond the
all-gather the statistics need anyway.

The arithmetic runs on torch's fused BatchNorm kernels where they exist (CUDA and other
accelerators) and on plain tensor operations on the CPU, so several CPU processes (gloo) can
synchronise their BatchNorms too; both give the statistics of BatchNorm over the processes'
batches put together.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ppdist.modeling.batch_norm import StatisticsBatchNorm

Tensor = torch.Tensor


def _shape(x: Tensor) -> List[int]:
    """Broadcast shape of per-channel values against ``x`` (N, C, ...)."""
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


def _reduced_dims(x: Tensor) -> List[int]:
    return [0] + list(range(2, x.dim()))


# ----------------------------------------------------------------------------- CPU arithmetic
# torch's fused SyncBatchNorm kernels (batch_norm_stats, ..._gather_stats_with_counts, _elemt,
# _backward_reduce, _backward_elemt) exist for accelerators only; these are the same formulas on
# tensors, in float32 (or float64) whatever the input's precision.
def cpu_stats(x: Tensor, eps: float) -> Tuple[Tensor, Tensor]:
    """Per-channel mean and ``1 / sqrt(biased variance + eps)`` of ``x``."""
    var, mean = torch.var_mean(
        x.float() if x.dtype != torch.float64 else x, dim=_reduced_dims(x), correction=0
    )
    return mean, torch.rsqrt(var + eps)


def cpu_gather_stats_with_counts(
    x: Tensor,
    mean_all: Tensor,
    invstd_all: Tensor,
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    momentum: float,
    eps: float,
    counts: Tensor,
) -> Tuple[Tensor, Tensor]:
    """The whole group's mean and invstd from every process's (mean, invstd, count); moves the
    running statistics toward them (running variance: the unbiased variance, as torch's kernel)."""
    weights = counts.to(mean_all.dtype).unsqueeze(1)
    total = weights.sum()
    mean = (mean_all * weights).sum(0) / total
    var_all = invstd_all.pow(-2) - eps
    var = ((var_all + (mean_all - mean).square()) * weights).sum(0) / total
    if running_mean is not None:
        running_mean.copy_(running_mean * (1 - momentum) + mean.to(running_mean.dtype) * momentum)
    if running_var is not None:
        unbiased = var * total / (total - 1)
        running_var.copy_(running_var * (1 - momentum) + unbiased.to(running_var.dtype) * momentum)
    return mean, torch.rsqrt(var + eps)


def cpu_elemt(
    x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor, invstd: Tensor, eps: float
) -> Tensor:
    """``(x - mean) * invstd * weight + bias`` per channel, in ``x``'s dtype."""
    shape = _shape(x)
    y = (x.to(mean.dtype) - mean.view(shape)) * invstd.view(shape)
    if weight is not None:
        y = y * weight.to(mean.dtype).view(shape)
    if bias is not None:
        y = y + bias.to(mean.dtype).view(shape)
    return y.to(x.dtype)


def cpu_backward_reduce(
    grad: Tensor,
    x: Tensor,
    mean: Tensor,
    invstd: Tensor,
    weight: Optional[Tensor],
    input_g: bool,
    weight_g: bool,
    bias_g: bool,
) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """This process's ``sum(dy)``, ``sum(dy * (x - mean))`` and the weight and bias gradients."""
    dims, shape = _reduced_dims(x), _shape(x)
    dy = grad.to(mean.dtype)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (x.to(mean.dtype) - mean.view(shape))).sum(dims)
    grad_weight = (sum_dy_xmu * invstd).to(weight.dtype) if weight_g and weight is not None else None
    grad_bias = sum_dy.to(weight.dtype) if bias_g and weight is not None else None
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def cpu_backward_elemt(
    grad: Tensor,
    x: Tensor,
    mean: Tensor,
    invstd: Tensor,
    weight: Optional[Tensor],
    sum_dy: Tensor,
    sum_dy_xmu: Tensor,
    counts: Tensor,
) -> Tensor:
    """The input gradient from the group's ``sum(dy)`` and ``sum(dy * (x - mean))``."""
    shape = _shape(x)
    total = counts.to(mean.dtype).sum()
    scale = invstd if weight is None else invstd * weight.to(mean.dtype)
    xmu = x.to(mean.dtype) - mean.view(shape)
    dy = grad.to(mean.dtype)
    out = (
        dy - (sum_dy / total).view(shape) - xmu * (invstd.square() * sum_dy_xmu / total).view(shape)
    ) * scale.view(shape)
    return out.to(x.dtype)


def _fused(x: Tensor) -> bool:
    """Whether torch's fused kernels serve ``x``'s device (every device but the CPU)."""
    return x.device.type != "cpu"


# ----------------------------------------------------------------------------- the collective
def _gather(combined: Tensor, group: Any, world_size: int) -> Tensor:
    """Every process's ``combined`` as rows [world_size, len]: one all-gather into one tensor
    (gloo has no all_gather_into_tensor: a list there)."""
    if dist.get_backend(group) == dist.Backend.GLOO:
        parts = [torch.empty_like(combined) for _ in range(world_size)]
        dist.all_gather(parts, combined, group=group)
        return torch.stack(parts)
    out = combined.new_empty(world_size, combined.numel())
    dist.all_gather_into_tensor(out, combined, group=group)
    return out


class _SyncBatchNormFunction(torch.autograd.Function):
    """Forward: local statistics, one all-gather, the group's statistics, normalisation.
    Backward: the local reductions, one all-reduce, the input gradient. No host read."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,
        weight: Optional[Tensor],
        bias: Optional[Tensor],
        running_mean: Optional[Tensor],
        running_var: Optional[Tensor],
        eps: float,
        momentum: float,
        group: Any,
        world_size: int,
        biased_running_var: bool,
    ) -> Tensor:
        if not (
            x.is_contiguous(memory_format=torch.channels_last)
            or x.is_contiguous(memory_format=torch.channels_last_3d)
        ):
            x = x.contiguous()
        if weight is not None:
            weight = weight.contiguous()
        channels = x.shape[1]
        fused = _fused(x)
        mean, invstd = torch.batch_norm_stats(x, eps) if fused else cpu_stats(x, eps)
        count = torch.full((1,), x.numel() // channels, dtype=mean.dtype, device=mean.device)
        gathered = _gather(torch.cat([mean, invstd, count]), group, world_size)
        mean_all, invstd_all, count_all = torch.split(gathered, channels, dim=1)
        counts = count_all.reshape(-1)
        if running_mean is not None and counts.dtype != running_mean.dtype:
            counts = counts.to(running_mean.dtype)
        factor = None
        if biased_running_var and running_var is not None:
            # the kernel moves running_var toward var * n / (n - 1); Paddle toward var: scale the
            # buffer by n / (n - 1) before and back after (exactly Paddle's update), n from the gather
            total = counts.to(torch.float64).sum()
            factor = (total / (total - 1).clamp_min(1)).to(running_var.dtype)
            running_var.mul_(factor)
        gather_stats = torch.batch_norm_gather_stats_with_counts if fused else cpu_gather_stats_with_counts
        mean, invstd = gather_stats(x, mean_all, invstd_all, running_mean, running_var, momentum, eps, counts)
        if factor is not None:
            running_var.div_(factor)
        ctx.save_for_backward(x, weight, mean, invstd, count_all.to(torch.int32))
        ctx.group = group
        if fused:
            return torch.batch_norm_elemt(x, weight, bias, mean, invstd, eps)
        return cpu_elemt(x, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tuple[Optional[Tensor], ...]:  # type: ignore[override]
        if not (
            grad_output.is_contiguous(memory_format=torch.channels_last)
            or grad_output.is_contiguous(memory_format=torch.channels_last_3d)
        ):
            grad_output = grad_output.contiguous()
        x, weight, mean, invstd, counts = ctx.saved_tensors
        fused = _fused(x)
        needs = ctx.needs_input_grad
        reduce = torch.batch_norm_backward_reduce if fused else cpu_backward_reduce
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = reduce(
            grad_output, x, mean, invstd, weight, needs[0], needs[1], needs[2]
        )
        grad_input = None
        if needs[0]:
            channels = sum_dy.shape[0]
            combined = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(combined, dist.ReduceOp.SUM, group=ctx.group)
            sum_dy, sum_dy_xmu = torch.split(combined, channels)
            if fused:
                if weight is not None and weight.dtype != mean.dtype:
                    weight = weight.to(mean.dtype)
                grad_input = torch.batch_norm_backward_elemt(
                    grad_output, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts
                )
            else:
                grad_input = cpu_backward_elemt(
                    grad_output, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts
                )
        if weight is None or not needs[1]:
            grad_weight = None
        if weight is None or not needs[2]:
            grad_bias = None
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None, None


class SyncBatchNorm(StatisticsBatchNorm):
    """A BatchNorm (the parameters, buffers and state dict of ``nn.SyncBatchNorm``) whose training
    forward synchronises with ``_SyncBatchNormFunction``: no host read, any device with a process
    group (CPU/gloo included; torch's DDP refuses its own SyncBatchNorm on CPU, hence not a
    subclass of it). ``biased_running_var``: keep the running variance by Paddle's rule. Outside a
    process group of several processes, and in evaluation, it is ``StatisticsBatchNorm``; with the
    rule and a momentum it leaves ``num_batches_tracked`` alone."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")
        if input.shape[1] == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")

    def synchronizes(self) -> bool:
        """Whether the training forward of this process syncs: a process group of >= 2."""
        if not (dist.is_available() and dist.is_initialized()):
            return False
        return dist.get_world_size(self.process_group or dist.group.WORLD) > 1

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        uses_batch_stats = self.training or self.running_mean is None
        if not (uses_batch_stats and self.training and self.synchronizes()):
            return StatisticsBatchNorm.forward(self, input)  # the plain BatchNorm, with the rule
        if input.shape[0] == 0 or input.numel() == 0:
            raise ValueError(
                "SyncBatchNorm got an empty batch: every process must bring samples to each training step"
            )
        momentum = 0.0 if self.momentum is None else self.momentum
        counts = self.momentum is None or not self.biased_running_var  # torch's rule counts batches
        if self.track_running_stats and self.num_batches_tracked is not None and counts:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative average (torch's rule; reads the count on the host)
                momentum = 1.0 / float(self.num_batches_tracked.item())
        tracked = self.track_running_stats
        group = self.process_group or dist.group.WORLD
        return _SyncBatchNormFunction.apply(
            input,
            self.weight,
            self.bias,
            self.running_mean if tracked else None,
            self.running_var if tracked else None,
            self.eps,
            momentum,
            group,
            dist.get_world_size(group),
            bool(self.biased_running_var),
        )


def convert_sync_batchnorm(module: nn.Module, process_group: Any = None) -> nn.Module:
    """``module`` with every BatchNorm (1d/2d/3d, torch's SyncBatchNorm) replaced by ppdist's
    ``SyncBatchNorm``, which takes over the same parameter and buffer objects (so their attributes,
    e.g. the no-decay tags, ``requires_grad`` of frozen ones, stay) and training mode."""
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        converted = SyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            process_group,
        )
        if module.affine:
            with torch.no_grad():
                converted.weight = module.weight
                converted.bias = module.bias
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        converted.training = module.training
        converted.biased_running_var = bool(getattr(module, "biased_running_var", False))
        if hasattr(module, "qconfig"):
            converted.qconfig = module.qconfig
        return converted
    for name, child in module.named_children():
        new_child = convert_sync_batchnorm(child, process_group)
        if new_child is not child:
            module.add_module(name, new_child)
    return module


def sync_batch_norms(model: nn.Module) -> Sequence[SyncBatchNorm]:
    """ppdist's SyncBatchNorms of ``model``."""
    return [m for m in model.modules() if isinstance(m, SyncBatchNorm)]
