"""Exponential moving average of a model's parameters and buffers."""

from __future__ import annotations

import copy
from typing import Any, Dict

import torch
from torch import nn


class ModelEMA:
    """``ema = decay * ema + (1 - decay) * weights`` after every optimizer step.

    Floating-point parameters and buffers (e.g. BatchNorm statistics) are averaged; integer
    buffers are copied. With ``use_thres_step`` the decay ramps up as
    ``min(decay, (1 + step) / (10 + step))`` (PaddleDetection's threshold decay).
    """

    def __init__(self, model: nn.Module, decay: float = 0.9998, use_thres_step: bool = False) -> None:
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.decay = float(decay)
        self.use_thres_step = use_thres_step
        self.step = 0

    def current_decay(self) -> float:
        if self.use_thres_step:
            return min(self.decay, (1 + self.step) / (10 + self.step))
        return self.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        decay = self.current_decay()
        current = model.state_dict()
        for name, ema_value in self.module.state_dict().items():
            value = current[name].detach()
            if ema_value.dtype.is_floating_point:
                ema_value.mul_(decay).add_(value.to(ema_value.dtype), alpha=1.0 - decay)
            else:
                ema_value.copy_(value)
        self.step += 1

    def state_dict(self) -> Dict[str, Any]:
        return {"module": self.module.state_dict(), "step": self.step}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.step = int(state["step"])
