"""How this process computes, derived once from ``Global`` and the device: the backend settings
(cuDNN autotuning, matmul precision, determinism) applied, the memory format (channels_last),
the autocast context and whether fp16 needs a loss scaler. Training (``build_trainer``),
evaluation (``eval_runner``), the benchmarks and the Python API take their runtime from
``build_runtime`` instead of wiring these settings themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ppdist.engine.amp import make_autocast, make_grad_scaler
from ppdist.engine.device_settings import apply_backend_settings, channels_last
from ppdist.engine.dist import DistEnv
from ppdist.engine.evaluator import Evaluator
from ppdist.metrics.base import Metric


@dataclass(frozen=True)
class Runtime:
    """The compute settings of one process (``build_runtime``)."""

    device: torch.device
    channels_last: bool
    autocast: Callable[[], Any]  # a zero-argument context factory (a null context without AMP)
    loss_scaling: bool  # fp16 autocast: gradients need a loss scaler

    def place(self, model: nn.Module) -> nn.Module:
        """``model`` on the device, in channels_last memory format when it applies."""
        model = model.to(self.device)
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def grad_scaler(self, glob: Mapping[str, Any]) -> torch.amp.GradScaler:
        """fp16's loss scaler with ``Global``'s settings; a no-op one without fp16."""
        return make_grad_scaler(glob, self.loss_scaling, self.device)

    def evaluator(self, loader: Any, postprocess: Any, metric: Metric, env: DistEnv) -> Evaluator:
        """An evaluator of ``loader`` that runs models under this runtime's autocast and memory format."""
        return Evaluator(loader, postprocess, metric, env, self.autocast, self.channels_last)


def build_runtime(glob: Mapping[str, Any], device: torch.device, input_sizes: int = 1) -> Runtime:
    """Apply ``Global``'s backend settings on ``device`` and return the runtime they make
    (``input_sizes``: how many input sizes training draws, for cuDNN's autotuning)."""
    apply_backend_settings(glob, device, input_sizes)
    autocast, loss_scaling = make_autocast(glob, device)
    return Runtime(device, channels_last(glob, device), autocast, loss_scaling)
