"""Exponential moving average of a model's parameters and buffers, as PaddleDetection computes it."""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from ppdist.modeling.batch_norm import VarianceScales
from ppdist.modeling.freezing import frozen_state_names

TensorLists = Tuple[
    List[torch.Tensor], List[torch.Tensor], List[torch.Tensor], List[torch.Tensor], List[torch.Tensor]
]


DECAY_TYPES = ("constant", "threshold", "exponential")


class ModelEMA:
    """PaddleDetection's ``ModelEMA``: an exponential moving average of the model's state.

    As the original: the average starts from zeros (float32) and after each optimizer step
    becomes ``decay * average + (1 - decay) * weights`` for every floating parameter and buffer
    (BatchNorm statistics included); the weights evaluated and saved (``module``) are the average
    divided by ``1 - d ** step``, ``d`` being the decay of the last step (no correction with the
    ``exponential`` type). ``decay_type``: ``constant`` (Paddle's ``normal``), ``threshold``
    (``min(decay, (1 + t) / (10 + t))``) or ``exponential`` (``decay * (1 - exp(-(t + 1) / 2000))``).
    Integer buffers are copied, and so are the tensors training never changes (frozen stages and
    ``freeze_norm``: ``ppdist.modeling.freezing.frozen_state_names``, PaddleDetection's
    ``ema_filter_no_grad`` and more), which therefore stay bit-identical to the model's instead of
    drifting by the bias correction. Before the first update ``module`` is the model itself (the
    original would give zeros).

    An update is a handful of ``torch._foreach_*`` kernels over cached tensor lists, not a Python
    loop over every tensor; the model's tensors must stay the same objects after the first update
    (``load_state_dict`` copies in place, so resuming is fine). A BatchNorm storing its running
    variance scaled (``ppdist.modeling.batch_norm``) is read at its true value (one kernel for all).

    ``update(model, skip=flag)`` gates the update on a device flag (``nan_policy: skip``): where it
    is set the average, the step count, the decay and ``module`` stay as they were, and nothing is
    read on the host — the step count and last decay then live on the device until ``step`` /
    ``last_decay`` / ``state_dict`` read them.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9998, decay_type: str = "threshold") -> None:
        if decay_type not in DECAY_TYPES:
            raise ValueError(f"EMA decay_type must be one of {DECAY_TYPES}, got {decay_type!r}")
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.decay = float(decay)
        self.decay_type = decay_type
        self._step = 0
        self._last_decay = 0.0
        self._on_device: Optional[torch.Tensor] = None  # [step, last decay] (float64) of gated updates
        frozen = frozen_state_names(model)
        self.average: Dict[str, torch.Tensor] = {
            name: torch.zeros_like(value, dtype=torch.float32)
            for name, value in self.module.state_dict().items()
            if value.dtype.is_floating_point and name not in frozen
        }
        self._model: Optional[nn.Module] = None
        self._lists: Optional[TensorLists] = None
        self._scales: Optional[VarianceScales] = None

    @property
    def step(self) -> int:
        """Updates taken so far (reads the device count after gated updates)."""
        self._to_host()
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = int(value)
        if self._on_device is not None:
            self._on_device[0].fill_(self._step)

    @property
    def last_decay(self) -> float:
        """The decay of the last update taken."""
        self._to_host()
        return self._last_decay

    @last_decay.setter
    def last_decay(self, value: float) -> None:
        self._last_decay = float(value)
        if self._on_device is not None:
            self._on_device[1].fill_(self._last_decay)

    def _to_host(self) -> None:
        """The host copies from the device count, which stays the one gated updates change (in
        place: a captured step, ``ppdist.engine.step_graph``, keeps writing to it)."""
        if self._on_device is not None:
            step, last_decay = self._on_device.tolist()
            self._step, self._last_decay = int(step), float(last_decay)

    def current_decay(self) -> float:
        """The decay the next update uses."""
        if self.decay_type == "threshold":
            return min(self.decay, (1 + self.step) / (10 + self.step))
        if self.decay_type == "exponential":
            return self.decay * (1 - math.exp(-(self.step + 1) / 2000))
        return self.decay

    def _tensor_lists(self, model: nn.Module) -> TensorLists:
        """(averages, EMA module averaged tensors, model ones, EMA copied tensors (integers and
        frozen tensors), model ones) by state-dict name."""
        if self._lists is None or self._model is not model:
            current = model.state_dict(keep_vars=True)
            lists: TensorLists = ([], [], [], [], [])
            for name, ema_value in self.module.state_dict(keep_vars=True).items():
                if name in self.average:
                    lists[0].append(self.average[name])
                    lists[1].append(ema_value)
                    lists[2].append(current[name])
                else:
                    lists[3].append(ema_value)
                    lists[4].append(current[name])
            self._model, self._lists = model, lists
            self._scales = VarianceScales(lists[2], model)
        return self._lists

    def _model_floats(self, model_floats: List[torch.Tensor]) -> List[torch.Tensor]:
        """The model's averaged tensors at their true values, in float32."""
        if self._scales is not None:
            model_floats = self._scales.true_values(model_floats)
        return [m if m.dtype == torch.float32 else m.float() for m in model_floats]

    def _device_decay(self, step: torch.Tensor) -> torch.Tensor:
        """``current_decay`` computed on the device from a device step count (float64)."""
        if self.decay_type == "threshold":
            return torch.clamp((1 + step) / (10 + step), max=self.decay)
        if self.decay_type == "exponential":
            return self.decay * (1 - torch.exp(-(step + 1) / 2000))
        return torch.full_like(step, self.decay)

    @torch.no_grad()
    def update(self, model: nn.Module, skip: Optional[torch.Tensor] = None) -> None:
        """One EMA step toward ``model``'s state; with ``skip`` (a device bool), none where it is set."""
        if skip is not None:
            self._gated_update(model, skip.reshape(()))
            return
        decay = self.current_decay()
        averages, ema_floats, model_floats, ema_copied, model_copied = self._tensor_lists(model)
        if averages:
            model_floats = self._model_floats(model_floats)
            torch._foreach_mul_(averages, decay)
            torch._foreach_add_(averages, model_floats, alpha=1.0 - decay)
        if ema_copied:
            torch._foreach_copy_(ema_copied, model_copied)
        self.step += 1
        self.last_decay = decay
        self._apply()

    def _gated_update(self, model: nn.Module, skip: torch.Tensor) -> None:
        """``update`` where ``skip`` is not set, nothing where it is: arithmetic on device scalars
        (a skipped step multiplies by exactly 1 and adds exactly 0; the model's tensors are finite,
        their step's changes having been put back)."""
        averages, ema_floats, model_floats, ema_copied, model_copied = self._tensor_lists(model)
        if self._on_device is None:
            device = skip.device
            self._on_device = torch.full((2,), float(self._step), dtype=torch.float64, device=device)
            self._on_device[1].fill_(self._last_decay)
        step, last_decay = self._on_device[0], self._on_device[1]
        taken = (~skip).to(torch.float64)
        decay = torch.where(skip, torch.ones_like(step), self._device_decay(step))
        if averages:
            model_floats = self._model_floats(model_floats)
            torch._foreach_mul_(averages, decay)
            torch._foreach_add_(averages, torch._foreach_mul(model_floats, 1 - decay))
        if ema_copied:
            torch._foreach_copy_(ema_copied, model_copied)
        step = step + taken
        last_decay = torch.where(skip, last_decay, decay)
        self._on_device.copy_(torch.stack([step, last_decay]))
        if not averages:
            return
        corrected = averages
        if self.decay_type != "exponential":  # no step taken yet: 1 - d ** 0 = 0, a division avoided
            corrected = torch._foreach_div(averages, torch.where(step > 0, 1 - last_decay**step, 1.0))
        started = (step > 0).to(torch.float32)  # before any step taken, ``module`` stays the model's
        torch._foreach_mul_(ema_floats, 1 - started)
        torch._foreach_add_(ema_floats, torch._foreach_mul(corrected, started))

    def _apply(self) -> None:
        """``module`` = the bias-corrected average (in the module's dtypes)."""
        averages, ema_floats = self._tensor_lists(self._model)[:2] if self._model is not None else ([], [])
        if not averages:
            return
        if self.decay_type != "exponential":
            averages = torch._foreach_div(averages, 1.0 - self.last_decay**self.step)
        torch._foreach_copy_(ema_floats, averages)

    def synced_tensors(self) -> List[torch.Tensor]:
        """The EMA module's buffers and their averages: what must equal rank 0's on every rank."""
        names = [name for name, _ in self.module.named_buffers()]
        return [b for _, b in self.module.named_buffers()] + [
            self.average[n] for n in names if n in self.average
        ]

    def state_dict(self) -> Dict[str, Any]:
        return {
            "module": self.module.state_dict(),
            "average": dict(self.average),
            "step": self.step,
            "last_decay": self.last_decay,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.step = int(state["step"])
        if "average" in state:
            self.last_decay = float(state["last_decay"])
            saved, module_state = state["average"], self.module.state_dict()
            correction = 1.0 if self.decay_type == "exponential" else 1.0 - self.last_decay**self.step
            for name, average in self.average.items():  # a tensor frozen then, not now: its value
                average.copy_(saved[name] if name in saved else module_state[name].float() * correction)
            return
        # a checkpoint of the earlier EMA (started from the weights, no correction): its module is
        # the average so far; continue as if it were the corrected value of the same steps
        saved_step = self.step
        self.step = max(saved_step - 1, 0)
        self.last_decay = self.current_decay() if saved_step else 0.0
        self.step = saved_step
        factor = 1.0 - self.last_decay**saved_step if saved_step else 0.0
        module_state = self.module.state_dict()
        for name, average in self.average.items():
            average.copy_(module_state[name].float() * factor)
