"""Backends that run a deploy graph on named numpy inputs and return named numpy outputs.

Both take ``{input_name: float32 array}`` and return ``{output_name: array}`` with the names of
the exported graph (``probs``; ``logits``; ``bbox``/``bbox_num`` or ``boxes``/``scores``), so the
task runners do not depend on the backend.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from ppdist.errors import ConfigError


class OnnxBackend:
    """An ONNX Runtime session on the CPU."""

    def __init__(self, path: str, providers: Sequence[str] = ("CPUExecutionProvider",)) -> None:
        try:
            import onnxruntime as ort  # noqa: PLC0415  (heavy; loaded for exported models only)
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigError("running an exported model needs onnxruntime: pip install onnxruntime") from exc
        self.path = path
        if not os.path.isfile(path):
            raise ConfigError(
                f"{path} not found: the exported model directory is incomplete (export it again)"
            )
        try:
            self.session = ort.InferenceSession(path, providers=list(providers))
        except Exception as exc:  # onnxruntime's own errors: InvalidProtobuf, Fail, ...
            first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ConfigError(
                f"{path} is not a loadable ONNX model ({first_line[:200]}); export it again"
            ) from None
        self.input_names: List[str] = [i.name for i in self.session.get_inputs()]
        self.output_names: List[str] = [o.name for o in self.session.get_outputs()]

    def run(self, inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        feed = {name: np.ascontiguousarray(inputs[name], dtype=np.float32) for name in self.input_names}
        return dict(zip(self.output_names, self.session.run(self.output_names, feed)))


class TorchBackend:
    """A deploy module (``ppdist.export.deploy_modules.build_deploy``) run under ``torch.no_grad``."""

    def __init__(
        self,
        module: nn.Module,
        output_names: Sequence[str],
        input_names: Optional[Sequence[str]] = None,
        device: str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.module = module.to(self.device).eval()
        self.output_names = list(output_names)
        self.input_names = (
            list(input_names) if input_names else list(inspect.signature(module.forward).parameters)
        )

    def run(self, inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        args = [
            torch.from_numpy(np.ascontiguousarray(inputs[name], dtype=np.float32)).to(self.device)
            for name in self.input_names
        ]
        with torch.no_grad():
            out = self.module(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(self.output_names):
            raise ValueError(f"the model returned {len(out)} output(s), expected {self.output_names}")
        return {name: tensor.detach().cpu().numpy() for name, tensor in zip(self.output_names, out)}


class NamedBackends:
    """Several backends on the same inputs (the sub-models of a distillation model): the ``main``
    one's outputs under their own names, and every one's as ``<name>/<output>``, in order."""

    def __init__(self, backends: Sequence[Tuple[str, Any]], main: str) -> None:
        self.backends = list(backends)
        named = dict(self.backends)
        if main not in named:
            raise ValueError(f"NamedBackends: no backend named {main!r} ({sorted(named)})")
        self.main = main
        self.input_names = list(named[main].input_names)
        self.output_names = list(named[main].output_names) + [
            f"{name}/{out}" for name, backend in self.backends for out in backend.output_names
        ]

    def run(self, inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        outputs: Dict[str, np.ndarray] = {}
        for name, backend in self.backends:
            own = backend.run(inputs)
            if name == self.main:
                outputs.update(own)
            outputs.update({f"{name}/{key}": value for key, value in own.items()})
        return outputs
