"""The non-finite guard's record: the first optimizer step whose loss, gradients or BatchNorm
statistics (updated by its forward: Inf/NaN inputs under a finite loss) were not finite.

The record lives on the device and is updated without reading anything on the host (the GPU never
waits); ``check`` reads it — on log steps and before every checkpoint — and raises
``NonFiniteError`` naming the step, its loss terms and the last good checkpoint. With the
``skip`` policy every step makes a device flag "leave this step out", all-reduced over the
processes so that all of them skip together, and the step is gated on it on the device: the
optimizer takes it as ``found_inf`` (torch's fused optimizers, and the fp16 loss scaler, skip their
update with it), the model's buffers (BatchNorm statistics of the step's forward) are put back, the
EMA's decay is gated (``ModelEMA.update(skip=...)``). Only an optimizer that cannot take
``found_inf`` (a non-fused one without fp16 loss scaling) needs the flag on the host, one read per
step, as a GradScaler does. The count of skipped steps stays on the device until a log line reads it.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from ppdist.engine.dist import DistEnv, all_gather_object
from ppdist.errors import PPDistError
from ppdist.modeling.batch_norm import VarianceScales

POLICIES = ("stop", "skip")


class NonFiniteError(PPDistError):
    """Training produced a NaN or Inf loss or gradient."""


def gradients_finite(parameters: Iterable[torch.nn.Parameter]) -> Optional[torch.Tensor]:
    """A device bool: every gradient of ``parameters`` is finite (None without gradients)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return None
    return torch.stack(torch._foreach_norm(grads)).isfinite().all()


def takes_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` honours a ``found_inf`` device flag (torch's fused Adam, AdamW,
    SGD, Adagrad: the contract GradScaler uses with them)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def step_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """``optimizer.step()`` that leaves parameters and state as they are where ``skip`` (a device
    flag) is set, without reading it (``takes_found_inf`` optimizers only)."""
    optimizer.found_inf = skip.float().reshape(())  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]


def skip_in_scaler(
    scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, skip: torch.Tensor
) -> None:
    """Make fp16's loss scaler treat this step as an overflow where ``skip`` is set: its step
    leaves the optimizer alone and its update backs the scale off, as for inf gradients. The
    scaler keeps its per-device ``found_inf`` after ``unscale_`` (called here if it was not)."""
    if not scaler._found_inf_per_device(optimizer):  # not unscaled yet in this step
        scaler.unscale_(optimizer)
    for found in scaler._found_inf_per_device(optimizer).values():
        found.copy_(torch.maximum(found, skip.to(found.device, found.dtype).reshape(found.shape)))


class BufferRollback:
    """The model's buffers (BatchNorm statistics and counts) as they were before a step's forward,
    put back on the device where the step is left out. Four kernels per dtype: the buffers are
    saved and restored as one flat tensor. A running variance stored scaled whose scale the forward
    changed (a new input size, ``ppdist.modeling.batch_norm``) is put back at the new scale."""

    def __init__(self, model: nn.Module) -> None:
        groups: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
        for buffer in model.buffers():
            groups.setdefault((buffer.device, buffer.dtype), []).append(buffer)
        self.groups = list(groups.values())
        self.scales = [VarianceScales(group, model) for group in self.groups]
        self.saved: List[torch.Tensor] = []
        self.saved_scales: List[List[float]] = []

    @staticmethod
    def _flat(group: List[torch.Tensor]) -> torch.Tensor:
        return torch.cat([tensor.reshape(-1) for tensor in group])

    def save(self) -> None:
        self.saved = [self._flat(group) for group in self.groups]
        self.saved_scales = [scales.scales() for scales in self.scales]

    def restore_where(self, skip: torch.Tensor) -> None:
        for group, saved, scales, before in zip(self.groups, self.saved, self.scales, self.saved_scales):
            scales.rescale(list(saved.split([tensor.numel() for tensor in group])), before)
            kept = torch.where(skip.reshape(()), saved, self._flat(group))
            parts = kept.split([tensor.numel() for tensor in group])
            torch._foreach_copy_(group, [part.view_as(tensor) for part, tensor in zip(parts, group)])


class NonFiniteWatch:
    """Keeps, on the device, the first step whose loss terms (or gradients) were not finite and
    those loss terms (``stop``), or the count of the steps the ``skip`` policy left out."""

    def __init__(self, policy: str = "stop") -> None:
        if policy not in POLICIES:
            raise ValueError(f"nan_policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.skipped_before = 0  # steps left out before a resume (from the checkpoint)
        self.skip_count: Optional[torch.Tensor] = None  # steps left out since, on the device
        self.names: List[str] = []
        self.first_step: Optional[torch.Tensor] = None
        self.first_values: Optional[torch.Tensor] = None

    @property
    def skipped(self) -> int:
        """Steps left out so far (reads the device count: log steps and checkpoints only)."""
        return self.skipped_before + (int(self.skip_count.item()) if self.skip_count is not None else 0)

    @skipped.setter
    def skipped(self, value: int) -> None:
        self.skipped_before, self.skip_count = int(value), None

    def observe(
        self,
        values: Dict[str, torch.Tensor],
        grads_finite: Optional[torch.Tensor],
        global_step: Union[int, torch.Tensor],
    ) -> torch.Tensor:
        """Record step ``global_step`` (1-based: the step being taken; a device int64 in a captured
        step); returns its device flag "not finite". The record is updated in place."""
        names = list(values)
        terms = torch.stack([values[name].detach().float().reshape(()) for name in names])
        bad = ~terms.isfinite().all()
        if grads_finite is not None:
            bad = bad | ~grads_finite
        if self.policy == "skip":  # left out, not a reason to stop
            return bad
        if self.first_step is None or names != self.names:
            self.names = names
            self.first_step = torch.full((), -1, dtype=torch.int64, device=terms.device)
            self.first_values = torch.zeros_like(terms)
        first = bad & (self.first_step < 0)
        self.first_step.copy_(torch.where(first, global_step, self.first_step))
        self.first_values.copy_(torch.where(first, terms, self.first_values))
        return bad

    def skip_flag(self, bad: torch.Tensor, env: DistEnv) -> torch.Tensor:
        """The ``skip`` policy's decision as a device flag (bool, shape [1]), the same on every
        process (one all-reduce, no host read); counted on the device."""
        flag = bad.to(torch.int32).reshape(1)
        if env.distributed:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if self.skip_count is None:
            self.skip_count = flag.clone()
        else:
            self.skip_count.add_(flag)
        return flag.bool()

    def found(self, env: DistEnv) -> Optional[Tuple[int, Dict[str, float], int]]:
        """Collective: ``(step, loss terms, rank)`` of the earliest recorded non-finite step over
        all processes, or None."""
        local = int(self.first_step.item()) if self.first_step is not None else -1
        mine = (local, dict(zip(self.names, self.first_values.tolist())), env.rank) if local >= 0 else None
        everyone = all_gather_object(mine, env) if env.distributed else [mine]
        seen = [entry for entry in everyone if entry is not None]
        return min(seen, key=lambda entry: entry[0]) if seen else None

    def check(self, env: DistEnv, last_good: Optional[Tuple[str, int]]) -> None:
        """Collective: raise ``NonFiniteError`` if any process recorded a non-finite step."""
        found = self.found(env)
        if found is None:
            return
        step, terms, rank = found
        shown = ", ".join(f"{name}: {value:.6g}" for name, value in terms.items())
        raise NonFiniteError(
            f"training diverged: the loss, the gradients or the BatchNorm statistics are not finite at "
            f"global_step {step} (rank {rank}: {shown}); nothing after it is saved; {last_good_text(last_good)} "
            f"with a lower learning rate, with Global.grad_clip, or with Global.nan_policy: skip to leave "
            f"such steps out"
        )


def last_good_text(last_good: Optional[Tuple[str, int]]) -> str:
    """Where to go on from, a clause that the caller ends with what to change (``... with a lower
    learning rate``): resume from the last checkpoint written (or resumed from) with finite
    tensors, or start again when there is none."""
    if not last_good:
        return "no checkpoint of this run was written before it: start the run again"
    return (
        f"the last good checkpoint is {last_good[0]} (global_step {last_good[1]}): resume from it "
        f"(-o Global.checkpoints={last_good[0]})"
    )


def float_buffers(model: nn.Module) -> List[torch.Tensor]:
    """The floating buffers of ``model`` (BatchNorm statistics): what ``buffers_finite`` checks."""
    return [b for b in model.buffers() if b.is_floating_point() and b.numel()]


def buffers_finite(buffers: List[torch.Tensor]) -> Optional[torch.Tensor]:
    """A device bool: every tensor of ``buffers`` (``float_buffers``) is finite (None without
    any). A forward on non-finite inputs can poison them under a finite loss."""
    if not buffers:
        return None
    return torch.stack([n.float() for n in torch._foreach_norm(buffers, float("inf"))]).isfinite().all()
