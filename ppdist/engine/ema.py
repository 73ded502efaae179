"""Exponential moving average of a model's parameters and buffers."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

TensorLists = Tuple[List[torch.Tensor], List[torch.Tensor], List[torch.Tensor], List[torch.Tensor]]


class ModelEMA:
    """``ema = decay * ema + (1 - decay) * weights`` after every optimizer step.

    Floating-point parameters and buffers (e.g. BatchNorm statistics) are averaged; integer
    buffers are copied. With ``use_thres_step`` the decay ramps up as
    ``min(decay, (1 + step) / (10 + step))`` (PaddleDetection's threshold decay).

    An update is a handful of ``torch._foreach_*`` kernels over cached tensor lists, not a Python
    loop over every tensor; the model's tensors must stay the same objects after the first update
    (``load_state_dict`` copies in place, so resuming is fine).
    """

    def __init__(self, model: nn.Module, decay: float = 0.9998, use_thres_step: bool = False) -> None:
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.decay = float(decay)
        self.use_thres_step = use_thres_step
        self.step = 0
        self._model: Optional[nn.Module] = None
        self._lists: Optional[TensorLists] = None
        self._cast = False

    def current_decay(self) -> float:
        if self.use_thres_step:
            return min(self.decay, (1 + self.step) / (10 + self.step))
        return self.decay

    def _tensor_lists(self, model: nn.Module) -> TensorLists:
        """(EMA floats, model floats, EMA integers, model integers), matched by state-dict name."""
        if self._lists is None or self._model is not model:
            current = model.state_dict(keep_vars=True)
            lists: TensorLists = ([], [], [], [])
            for name, ema_value in self.module.state_dict(keep_vars=True).items():
                floating = ema_value.dtype.is_floating_point
                lists[0 if floating else 2].append(ema_value)
                lists[1 if floating else 3].append(current[name])
            self._model, self._lists = model, lists
            self._cast = any(m.dtype != e.dtype for e, m in zip(lists[0], lists[1]))
        return self._lists

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        decay = self.current_decay()
        ema_floats, model_floats, ema_ints, model_ints = self._tensor_lists(model)
        if ema_floats:
            if self._cast:
                model_floats = [m.to(e.dtype) for e, m in zip(ema_floats, model_floats)]
            torch._foreach_mul_(ema_floats, decay)
            torch._foreach_add_(ema_floats, model_floats, alpha=1.0 - decay)
        if ema_ints:
            torch._foreach_copy_(ema_ints, model_ints)
        self.step += 1

    def state_dict(self) -> Dict[str, Any]:
        return {"module": self.module.state_dict(), "step": self.step}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.step = int(state["step"])
