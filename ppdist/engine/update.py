"""How a training step's gradients become new weights: the update policy.

``WeightUpdate`` owns what happens between the forward pass and the next one: the loss scaler's
scaled backward, the normalisation of accumulated micro-batches (``ppdist.losses.normalizer``),
unscaling and clipping, the non-finite watch and ``nan_policy: skip`` (``ppdist.engine.nonfinite``),
the optimizer step, the LR schedule step and the EMA update. The trainer runs the forward and the
loss; this object does the rest, reading nothing on the host (but the one documented read of a
skip flag by an optimizer that cannot take it on the device)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import torch
from torch import nn

from ppdist.engine.dist import DistEnv
from ppdist.engine.ema import ModelEMA
from ppdist.engine.nonfinite import (
    BufferRollback,
    NonFiniteWatch,
    buffers_finite,
    float_buffers,
    gradients_finite,
    skip_in_scaler,
    step_unless,
    takes_found_inf,
)
from ppdist.losses.normalizer import NORMALIZER_KEY


class WeightUpdate:
    """The update policy of ``model``'s training steps: ``optimizer`` and ``scheduler`` stepped
    once per step, through ``scaler`` (a ``GradScaler``; a disabled one by default), after
    ``clip_gradients(model)`` (in place), with the ``ema`` updated after; ``nan_policy`` (``stop`` /
    ``skip``; None: not watched) keeps the non-finite record. ``floor``, where a method takes it, is
    the loss's lower bound of its all-reduced normaliser (``ppdist.losses.normalizer``)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        *,
        env: Optional[DistEnv] = None,
        scaler: Optional[torch.amp.GradScaler] = None,
        ema: Optional[ModelEMA] = None,
        clip_gradients: Optional[Callable[[nn.Module], Any]] = None,
        nan_policy: Optional[str] = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.env = env or DistEnv()
        self.scaler = scaler if scaler is not None else torch.amp.GradScaler("cpu", enabled=False)
        self.ema, self.clip_gradients = ema, clip_gradients
        self.nonfinite = NonFiniteWatch(nan_policy) if nan_policy else None
        # the model's buffers before each forward, put back when nan_policy skip leaves a step out
        self.rollback = BufferRollback(model) if nan_policy == "skip" else None
        self.stat_buffers = float_buffers(model)  # checked after each forward (nan_policy)
        self.static = False  # the captured form (``capture_ready``)
        self.no_skip: Optional[torch.Tensor] = None

    def check_built_for(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        """Raise ``ValueError`` unless this policy updates exactly these parts."""
        if self.model is not model or self.optimizer is not optimizer or self.scheduler is not scheduler:
            raise ValueError(
                "update (WeightUpdate) must be built for the trainer's model, optimizer and scheduler"
            )

    def capture_ready(self, device: torch.device) -> None:
        """The form of the update that a captured step (``ppdist.engine.step_graph``) can replay:
        the learning rates in device tensors, the EMA's count and decay on the device, and the LR
        schedule stepped by the caller after the step (``apply`` leaves it), on the host."""
        use_tensor_lr = getattr(self.scheduler, "use_tensor_lr", None)
        if use_tensor_lr is None:
            raise TypeError(
                f"a captured step needs ppdist's IterScheduler (its learning rates in device tensors), "
                f"got {type(self.scheduler).__name__}"
            )
        use_tensor_lr(device)
        self.static = True
        self.no_skip = torch.zeros((), dtype=torch.bool, device=device)

    def begin(self) -> None:
        """Before the step's first forward: gradients cleared, the buffers kept for a rollback."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.rollback is not None:
            self.rollback.save()

    def backward(self, losses: Mapping[str, Any], count: int, floor: float = 0.0) -> Optional[torch.Tensor]:
        """The scaled backward of one of the step's ``count`` micro-batches, weighted so that the
        step's gradient is that of all of them together; returns the micro-batch's own loss
        normaliser when the loss has one (the step's is applied by ``apply``)."""
        loss = losses["loss"]
        normalizer = None
        if count > 1:
            normalizer = losses.get(NORMALIZER_KEY)
            if normalizer is None:
                loss = loss / count
            else:  # undo the micro-batch's own normaliser; the step's is applied in ``apply``
                loss = loss * normalizer.clamp(min=floor)
        self.scaler.scale(loss).backward()
        return normalizer

    def apply(
        self,
        values: Dict[str, torch.Tensor],
        normalizers: List[torch.Tensor],
        count: int,
        next_step: Union[int, torch.Tensor],
        floor: float = 0.0,
    ) -> None:
        """After the step's last backward: the accumulated gradient normalised, unscaled and
        clipped, the non-finite watch (``values``: the step's loss terms; ``next_step``: the
        global step being taken, a device tensor in the captured form), the optimizer step (or
        its skip), the LR schedule (not in the captured form) and the EMA."""
        if normalizers:
            step_normalizer = torch.stack(normalizers).mean().clamp(min=floor)
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            torch._foreach_mul_(grads, 1.0 / (count * step_normalizer))
        if self.clip_gradients is not None:
            self.scaler.unscale_(self.optimizer)
        skip = self._watch(values, next_step) if self.nonfinite is not None else None
        if self.clip_gradients is not None:
            self.clip_gradients(self.model)
        skip = self._step_optimizer(skip)
        if not self.static:
            self.scheduler.step()  # a skipped step counts too (the schedule follows global_step)
        if self.ema is not None and skip is not True:
            device_skip = skip if isinstance(skip, torch.Tensor) else self.no_skip  # None unless static
            self.ema.update(self.model, skip=device_skip)

    def _watch(self, values: Dict[str, torch.Tensor], next_step: int) -> Optional[torch.Tensor]:
        """Record whether the step's loss terms and gradients are finite (on the device; under an
        fp16 GradScaler the gradients are its business: it skips overflowing steps itself); with
        ``nan_policy: skip``, the device flag "leave this step out", the same on every process."""
        grads_finite = None if self.scaler.is_enabled() else gradients_finite(self.model.parameters())
        stats_finite = buffers_finite(self.stat_buffers)  # the forward's BatchNorm statistics
        if stats_finite is not None:
            grads_finite = stats_finite if grads_finite is None else grads_finite & stats_finite
        bad = self.nonfinite.observe(values, grads_finite, next_step)
        return self.nonfinite.skip_flag(bad, self.env) if self.nonfinite.policy == "skip" else None

    def _step_optimizer(self, skip: Optional[torch.Tensor]) -> Any:
        """The optimizer step (through the loss scaler), left out where ``skip`` is set: on the device
        when the optimizer or the fp16 scaler takes the flag (then the model's buffers are put back
        on the device too), else by reading it on the host. Returns the flag as the EMA needs it:
        None (no skip policy), a device flag, or the host's decision (True: left out)."""
        if skip is None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return None
        if self.scaler.is_enabled():
            skip_in_scaler(self.scaler, self.optimizer, skip)  # as an overflow: no step, the scale backs off
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif takes_found_inf(self.optimizer):
            step_unless(self.optimizer, skip)
        else:  # a non-fused optimizer cannot take the flag: read it (one host read per step)
            if bool(skip.item()):
                self.rollback.restore_where(skip)
                return True
            self.optimizer.step()
            return False
        self.rollback.restore_where(skip)
        return skip
