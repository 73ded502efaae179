"""The non-finite guard's record: the first optimizer step whose loss or gradients were not finite.

The record lives on the device and is updated without reading anything on the host (the GPU never
waits); ``check`` reads it — on log steps and before every checkpoint — and raises
``NonFiniteError`` naming the step, its loss terms and the last good checkpoint. With the
``skip`` policy the trainer instead asks ``should_skip`` every step: one flag, all-reduced
over the processes so that all of them skip together, read on the host (the price of skipping,
as a GradScaler's own check).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist

from ppdist.engine.dist import DistEnv, all_gather_object
from ppdist.errors import PPDistError

POLICIES = ("stop", "skip")


class NonFiniteError(PPDistError):
    """Training produced a NaN or Inf loss or gradient."""


def gradients_finite(parameters: Iterable[torch.nn.Parameter]) -> Optional[torch.Tensor]:
    """A device bool: every gradient of ``parameters`` is finite (None without gradients)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return None
    return torch.stack(torch._foreach_norm(grads)).isfinite().all()


class NonFiniteWatch:
    """Keeps, on the device, the first step whose loss terms (or gradients) were not finite and
    those loss terms; ``skipped`` counts the steps the ``skip`` policy left out."""

    def __init__(self, policy: str = "stop") -> None:
        if policy not in POLICIES:
            raise ValueError(f"nan_policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.skipped = 0
        self.names: List[str] = []
        self.first_step: Optional[torch.Tensor] = None
        self.first_values: Optional[torch.Tensor] = None

    def observe(
        self, values: Dict[str, torch.Tensor], grads_finite: Optional[torch.Tensor], global_step: int
    ) -> torch.Tensor:
        """Record step ``global_step`` (1-based: the step being taken); returns its device flag "not finite"."""
        names = list(values)
        terms = torch.stack([values[name].detach().float().reshape(()) for name in names])
        bad = ~terms.isfinite().all()
        if grads_finite is not None:
            bad = bad | ~grads_finite
        if self.first_step is None or names != self.names:
            self.names = names
            self.first_step = torch.full((), -1, dtype=torch.int64, device=terms.device)
            self.first_values = torch.zeros_like(terms)
        first = bad & (self.first_step < 0)
        self.first_step = torch.where(first, torch.full_like(self.first_step, global_step), self.first_step)
        self.first_values = torch.where(first, terms, self.first_values)
        return bad

    def should_skip(self, bad: torch.Tensor, env: DistEnv) -> bool:
        """The ``skip`` policy's per-step decision, the same on every process; counts it. Clears
        the record of that step, which is left out rather than stopping the run."""
        flag = bad.to(torch.int32).reshape(1)
        if env.distributed:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        skip = bool(flag.item())
        if skip:
            self.skipped += 1
            self.first_step = None  # the step is left out: nothing to stop for
        return skip

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
        saved = (
            f"the last good checkpoint is {last_good[0]} (global_step {last_good[1]}); resume from it "
            f"with -o Global.checkpoints={last_good[0]}"
            if last_good
            else "no checkpoint of this run was written before it"
        )
        raise NonFiniteError(
            f"training diverged: the loss or the gradients are not finite at global_step {step} "
            f"(rank {rank}: {shown}); nothing after it is saved, {saved}, and lower the learning rate, "
            f"set Global.grad_clip, or set Global.nan_policy: skip to leave such steps out"
        )
