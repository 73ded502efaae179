"""BatchNorm running statistics as Paddle updates them.

Both frameworks move ``running_var`` toward the batch variance by the same momentum, but Paddle
uses the biased (population) batch variance and torch the unbiased one, ``N / (N - 1)`` times
larger (``N``: the values per channel, batch x height x width; for SyncBatchNorm the count over
every process). Where ``N`` is small (PP-LiteSeg's 1x1 SPPM bin sees one value per image) a torch
run's running variance grows by a visibly different rule from the original's.

``use_paddle_statistics(model)`` makes every BatchNorm of ``model`` follow Paddle's rule without
replacing its kernel. torch's ``BatchNorm1d/2d/3d`` become ``ppdist.modeling.batch_norm``'s
``StatisticsBatchNorm`` in place (same object, parameters, buffers and state-dict layout): the
running variance is stored times ``N / (N - 1)`` while training, so that torch's own (cuDNN) kernel
leaves exactly ``(1 - m) * running_var + m * biased_var``, with no extra kernel per step and no
Python hook; ``N`` comes from the input's shape (no device read). ppdist's ``SyncBatchNorm`` (a
``StatisticsBatchNorm``) applies the rule itself while it synchronises, with ``N`` from the counts
it gathers anyway. Any other BatchNorm class (torch's own ``nn.SyncBatchNorm``, not made by ppdist)
gets two forward hooks instead: ``running_var`` times ``N / (N - 1)`` before the kernel, divided
back after it (under a process group ``N`` from an all-reduce of the process's count, one
collective per layer). Evaluation (and BatchNorms without running statistics) is untouched.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ppdist.modeling.batch_norm import take_over

RULES = ("paddle", "torch")

Factor = Union[float, torch.Tensor]


def _updates_running_var(module: _BatchNorm) -> bool:
    return module.training and module.track_running_stats and module.running_var is not None


def _synchronized(module: _BatchNorm) -> bool:
    if not isinstance(module, nn.SyncBatchNorm) or not dist.is_available() or not dist.is_initialized():
        return False
    return dist.get_world_size(module.process_group) > 1


class _PaddleVarianceRule:
    """The pre/post forward hooks of one BatchNorm; keeps the factor between the two."""

    def __init__(self) -> None:
        self.pending: Dict[int, Factor] = {}

    def before(self, module: _BatchNorm, args: Tuple[Any, ...]) -> None:
        if not _updates_running_var(module):
            return
        x = args[0]
        count = x.numel() // x.shape[1] if x.dim() > 1 and x.shape[1] else 0
        if _synchronized(module):  # torch's own SyncBatchNorm: its kernel keeps the total count
            # torch.full fills on the device (no host-to-device copy, which would wait for the stream)
            total = torch.full((1,), float(count), dtype=torch.float64, device=module.running_var.device)
            dist.all_reduce(total, group=module.process_group)
            factor: Factor = (total / (total - 1).clamp_min(1)).to(module.running_var.dtype)
        elif count > 1:
            factor = count / (count - 1)
        else:
            return  # torch rejects the batch itself
        module.running_var.mul_(factor)
        self.pending[id(module)] = factor

    def after(self, module: _BatchNorm, args: Tuple[Any, ...], output: Any) -> None:
        factor = self.pending.pop(id(module), None)
        if factor is not None:
            # Through ``.data``: autograd saved running_var with the forward (at the version the
            # kernel left); a training-mode backward never reads it (it uses the batch's saved
            # mean and invstd), so the undo must not fail autograd's version check.
            module.running_var.data.div_(factor)


def batch_norms(model: nn.Module) -> Dict[str, _BatchNorm]:
    """Every BatchNorm (1d/2d/3d, SyncBatchNorm) of ``model`` by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, _BatchNorm)}


def use_paddle_statistics(model: nn.Module) -> int:
    """Make every BatchNorm of ``model`` update ``running_var`` with the biased batch variance, as
    Paddle does; returns how many BatchNorms that is. Apply after SyncBatchNorm conversion (which
    builds new modules); calling it twice is a no-op for modules already set."""
    rule = _PaddleVarianceRule()
    modules = batch_norms(model)
    for module in modules.values():
        if take_over(module):
            module.biased_running_var = True  # type: ignore[assignment]
            continue
        if getattr(module, "_ppdist_paddle_statistics", False):
            continue
        module.register_forward_pre_hook(rule.before)
        module.register_forward_hook(rule.after, always_call=True)
        module._ppdist_paddle_statistics = True  # type: ignore[assignment]
    return len(modules)


def apply_statistics_rule(model: nn.Module, rule: str) -> int:
    """``Global.bn_statistics``: 'paddle' (biased batch variance, the originals') or 'torch'
    (unbiased, PyTorch's BatchNorm as it is, ``num_batches_tracked`` counted); returns the number of
    BatchNorms switched to Paddle's rule (which leave ``num_batches_tracked`` alone where a momentum
    is set: only torch's cumulative average reads it)."""
    if rule not in RULES:
        raise ValueError(f"bn_statistics must be one of {RULES}, got {rule!r}")
    return use_paddle_statistics(model) if rule == "paddle" else 0
