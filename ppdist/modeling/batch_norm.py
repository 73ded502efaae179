"""BatchNorm whose running variance follows Paddle's rule at no extra kernel launch per step.

Paddle moves ``running_var`` toward the biased batch variance, torch's kernel toward the unbiased
one, ``k = N / (N - 1)`` times larger (``N``: values per channel). ``StatisticsBatchNorm`` keeps the
buffer *stored* as ``k`` times the true running variance while it trains: torch's own (cuDNN)
kernel then moves the stored value to ``k`` times Paddle's update exactly
(``(1 - m) k v + m k biased = k ((1 - m) v + m biased)``). The stored value is rescaled only when
``N`` changes (one ``mul_``: a new input size), and divided back (one ``div_``) whenever anyone
reads it: the ``running_var`` attribute, ``state_dict``, ``load_state_dict`` and every evaluation
forward see the true value. What reads the buffer tensors themselves on every step (the EMA, the
non-finite rollback; ``state_dict(keep_vars=True)`` gives the buffer as stored) asks
``VarianceScales`` for the true values: one ``foreach`` kernel for all layers. The stored bits
change only where everyone's do (a size change, an evaluation, a checkpoint), so a resumed run
repeats the uninterrupted one exactly. DDP's buffer broadcast sends the stored values: every process's batches have the same
shape at each step (ppdist's rule), hence the same scale.

With the rule and a momentum set (every BatchNorm of the recipes), ``num_batches_tracked`` is not
incremented (torch only counts with it; the buffer stays, so state dicts keep their layout).
Without the rule (``biased_running_var`` unset) it is torch's BatchNorm as it is. Parameter and buffer
names are torch's: checkpoints and converted Paddle weights load unchanged. Under ``torch.compile``
the buffer keeps the true value and the factor is applied around the kernel (the compiler fuses it).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

Tensor = torch.Tensor


def unbiased_factor(x: Tensor) -> float:
    """``N / (N - 1)`` for the values per channel of ``x`` (N, C, ...); 1 where ``N <= 1``."""
    count = x.numel() // x.shape[1] if x.dim() > 1 and x.shape[1] else 0
    return count / (count - 1) if count > 1 else 1.0


class StatisticsBatchNorm(_BatchNorm):
    """A BatchNorm base: where ``biased_running_var`` is set, Paddle's variance rule and no
    ``num_batches_tracked`` update with a momentum (module docs); torch's BatchNorm otherwise.
    ``running_var`` reads the true value."""

    biased_running_var: bool = False
    _var_scale: float = 1.0  # the stored running_var is the true one times this

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "running_var":  # a new tensor holds the true value
            super().__setattr__("_var_scale", 1.0)
        super().__setattr__(name, value)

    @property
    def running_var(self) -> Optional[Tensor]:  # type: ignore[override]
        """The true running variance (the stored one divided back first)."""
        buffers = self.__dict__.get("_buffers")
        if buffers is None or "running_var" not in buffers:
            raise AttributeError("running_var")
        self.store_true_variance()
        return buffers["running_var"]

    def store_true_variance(self) -> None:
        """Divide the stored running variance back to the true one (one kernel, if scaled)."""
        if self._var_scale != 1.0:
            stored = self._buffers.get("running_var")
            if stored is not None:
                # through .data: a live forward's autograd saved the buffer (a training backward never reads it)
                stored.data.div_(self._var_scale)
            self._var_scale = 1.0

    @property
    def variance_scale(self) -> float:
        """What the stored running variance is the true one times."""
        return self._var_scale

    def _fast_training(self, input: Tensor) -> bool:
        stored = self._buffers.get("running_var")
        return (
            self.training
            and self.biased_running_var  # else torch's BatchNorm as it is (``bn_statistics: torch``)
            and self.track_running_stats
            and self.momentum is not None
            and stored is not None
            and self._buffers.get("running_mean") is not None
            and input.dim() > 1
            and input.shape[1] == stored.shape[0]  # else torch raises, leaving the buffer as it was
            and not torch.compiler.is_compiling()
        )

    def forward(self, input: Tensor) -> Tensor:
        if not self._fast_training(input):
            return self._torch_forward(input)
        self._check_input_dim(input)
        stored = self._buffers["running_var"]
        scale = unbiased_factor(input)
        if scale != self._var_scale and scale != 1.0:
            stored.data.mul_(scale / self._var_scale)
            self._var_scale = scale
        return F.batch_norm(
            input, self.running_mean, stored, self.weight, self.bias, True, self.momentum, self.eps
        )

    def _torch_forward(self, input: Tensor) -> Tensor:
        """The buffer holding the true value (evaluation, a compiled graph, a cumulative average, an
        input torch rejects): Paddle's rule as a factor around the kernel, torch's forward where the
        momentum is unset (its cumulative average counts the batches)."""
        self.store_true_variance()
        stored = self._buffers.get("running_var")
        if not (self.training and self.track_running_stats and stored is not None):
            return super().forward(input)
        scale = 1.0
        if self.biased_running_var and input.dim() > 1 and input.shape[1] == stored.shape[0]:
            scale = unbiased_factor(input)
        if scale != 1.0:
            stored.mul_(scale)
        try:
            if self.momentum is None or self._buffers.get("running_mean") is None:
                return super().forward(input)
            self._check_input_dim(input)
            return F.batch_norm(
                input, self.running_mean, stored, self.weight, self.bias, True, self.momentum, self.eps
            )
        finally:
            if scale != 1.0:
                stored.data.div_(scale)

    def _save_to_state_dict(self, destination: Dict[str, Any], prefix: str, keep_vars: bool) -> None:
        if not keep_vars:  # values: the true one. keep_vars: the buffer itself, as stored (for
            self.store_true_variance()  # references taken once, read through VarianceScales)
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
        self.store_true_variance()
        super()._load_from_state_dict(state_dict, prefix, *args)


class BatchNorm1d(StatisticsBatchNorm, nn.BatchNorm1d):
    """``nn.BatchNorm1d`` with ``StatisticsBatchNorm``'s bookkeeping."""


class BatchNorm2d(StatisticsBatchNorm, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` with ``StatisticsBatchNorm``'s bookkeeping."""


class BatchNorm3d(StatisticsBatchNorm, nn.BatchNorm3d):
    """``nn.BatchNorm3d`` with ``StatisticsBatchNorm``'s bookkeeping."""


TAKEN_OVER = {nn.BatchNorm1d: BatchNorm1d, nn.BatchNorm2d: BatchNorm2d, nn.BatchNorm3d: BatchNorm3d}


def take_over(module: nn.Module) -> bool:
    """Make a torch ``BatchNorm1d/2d/3d`` (exactly that class) a ``StatisticsBatchNorm`` in place:
    the same object, parameters, buffers, hooks and state-dict layout. False for other classes."""
    cls = TAKEN_OVER.get(type(module))
    if cls is None:
        return isinstance(module, StatisticsBatchNorm)
    module.__class__ = cls
    return True


def store_true_variances(model: nn.Module) -> None:
    """Every ``StatisticsBatchNorm`` of ``model`` with its true running variance in the buffer
    (before the buffers travel as they are, e.g. a broadcast from rank 0)."""
    for module in model.modules():
        if isinstance(module, StatisticsBatchNorm):
            module.store_true_variance()


def variance_scales(model: nn.Module) -> Dict[StatisticsBatchNorm, float]:
    """What each ``StatisticsBatchNorm`` of ``model`` stores its running variance scaled by now
    (with ``restore_variance_scales``: put back with the buffers' stored bits, exactly)."""
    return {m: m.variance_scale for m in model.modules() if isinstance(m, StatisticsBatchNorm)}


def restore_variance_scales(scales: Mapping[StatisticsBatchNorm, float]) -> None:
    """Set the scales ``variance_scales`` gave back, after their buffers' stored bits were restored."""
    for module, scale in scales.items():
        module._var_scale = scale


def rescale_variances(scales: Mapping[StatisticsBatchNorm, float]) -> None:
    """Store each running variance at the scale ``scales`` gives (``variance_scales``), as a
    training forward of that input size would (one ``mul_`` where it differs: after an evaluation
    or a checkpoint divided it back). A captured step (``ppdist.engine.step_graph``) recorded the
    scales it met and cannot make that decision itself."""
    for module, scale in scales.items():
        if module._var_scale != scale:
            stored = module._buffers.get("running_var")
            if stored is not None:
                stored.data.mul_(scale / module._var_scale)
            module._var_scale = scale


class VarianceScales:
    """Which tensors of a fixed list are running variances stored scaled (``StatisticsBatchNorm``
    of ``model``), for those that read the buffers themselves every step."""

    def __init__(self, tensors: Sequence[Tensor], model: nn.Module) -> None:
        owners = {
            id(m._buffers["running_var"]): m
            for m in model.modules()
            if isinstance(m, StatisticsBatchNorm) and m._buffers.get("running_var") is not None
        }
        self.entries = [(i, owners[id(t)]) for i, t in enumerate(tensors) if id(t) in owners]

    def scales(self) -> List[float]:
        """The current scale of each entry."""
        return [module.variance_scale for _, module in self.entries]

    def true_values(self, tensors: List[Tensor]) -> List[Tensor]:
        """``tensors`` with the scaled running variances divided back, out of place (one kernel)."""
        scaled = [(i, module.variance_scale) for i, module in self.entries if module.variance_scale != 1.0]
        if not scaled:
            return tensors
        quotients = torch._foreach_div([tensors[i] for i, _ in scaled], [scale for _, scale in scaled])
        out = list(tensors)
        for (i, _), quotient in zip(scaled, quotients):
            out[i] = quotient
        return out

    def rescale(self, copies: List[Tensor], before: List[float]) -> None:
        """Bring ``copies`` (of the list's tensors, stored at the scales ``before``) to the current
        scales, in place (one kernel where any changed)."""
        changed = [
            (i, now / then) for (i, _), then, now in zip(self.entries, before, self.scales()) if now != then
        ]
        if changed:
            torch._foreach_mul_([copies[i] for i, _ in changed], [ratio for _, ratio in changed])
