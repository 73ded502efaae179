"""ONNX and TorchScript files from a deploy module, and an ONNX Runtime parity check."""

from __future__ import annotations

import logging
import os
import warnings
from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from ppdist.tasks import GraphSpec

logger = logging.getLogger("ppdist")
OPSET = 17


def example_inputs(spec: GraphSpec, shape: Sequence[int], seed: int = 0) -> Tuple[torch.Tensor, ...]:
    """Random inputs of the graph for an image ``shape`` (detection adds scale_factor)."""
    gen = torch.Generator().manual_seed(seed)
    image = torch.randn(*shape, generator=gen)
    if "scale_factor" in spec.input_names:
        return image, torch.rand(shape[0], 2, generator=gen) * 0.5 + 0.75
    return (image,)


def has_scripted_part(module: nn.Module) -> bool:
    """Whether ``module`` holds a ``torch.jit.script`` sub-module (e.g. SLANet's decode loop)."""
    return any(isinstance(m, torch.jit.ScriptModule) for m in module.modules())


def load_torchvision_ops() -> None:
    """Register torchvision's operators (NMS, RoIAlign) before a trace meets them: torchvision
    imported for the first time inside a trace fails (its import calls an operator). Imported here,
    not with the module: torchvision.ops loads torch._dynamo (about 1-3 s), which the tools' -h do
    not need."""
    import torchvision.ops  # noqa: F401, PLC0415


def traced(module: nn.Module, inputs: Tuple[torch.Tensor, ...]) -> torch.jit.ScriptModule:
    """``torch.jit.trace`` of ``module`` (its scripted parts kept as they are, loops included)."""
    load_torchvision_ops()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(module, inputs, check_trace=False)


def export_onnx(module: nn.Module, spec: GraphSpec, path: str) -> str:
    """Write ``path`` with the TorchScript-based exporter (opset 17), falling back to the dynamo
    exporter (opset 18) for graphs it cannot express with dynamic sizes; returns which one. A
    module with a scripted part is traced first: the exporter's own trace refuses a scripted
    sub-module, and exports a traced module's graph as it is (a scripted loop stays one Loop)."""
    load_torchvision_ops()
    inputs = example_inputs(spec, spec.example_shapes[0])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                traced(module, inputs) if has_scripted_part(module) else module,
                inputs,
                path,
                opset_version=OPSET,
                dynamo=False,
                input_names=spec.input_names,
                output_names=spec.output_names,
                dynamic_axes=spec.dynamic_axes,
            )
        return "torchscript"
    except Exception as exc:  # noqa: BLE001 - any exporter failure: try the other exporter
        logger.info(
            "TorchScript-based ONNX export failed (%s); using the dynamo exporter",
            (str(exc).splitlines() or ["no message"])[0][:200],
        )
    dims = {}
    for name, axes in spec.dynamic_axes.items():
        if name in spec.input_names:
            dims[name] = {
                axis: torch.export.Dim(f"{name}_{label}", min=1 if label == "batch" else 32, max=8192)
                for axis, label in axes.items()
            }
    program = torch.onnx.export(
        module,
        inputs,
        dynamo=True,
        dynamic_shapes=dims,
        opset_version=OPSET + 1,
        input_names=spec.input_names,
        output_names=spec.output_names,
        verbose=False,
    )
    program.save(path)
    return "dynamo"


def export_torchscript(module: nn.Module, spec: GraphSpec, path: str) -> None:
    """Traced, frozen (Conv+BN folded) TorchScript module."""
    inputs = example_inputs(spec, spec.example_shapes[0])
    module_ts = traced(module, inputs)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frozen = torch.jit.freeze(module_ts.eval())
    frozen.save(path)


def onnx_parity(path: str, module: nn.Module, spec: GraphSpec) -> List[Dict[str, float]]:
    """Max abs difference per output between ONNX Runtime and PyTorch at every example shape,
    divided by the output's largest magnitude when that exceeds 1 (so logits compare relatively)."""
    import onnxruntime as ort  # noqa: PLC0415  (heavy; loaded by the parity check only)

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    report = []
    for seed, shape in enumerate(spec.example_shapes):
        inputs = example_inputs(spec, shape, seed=seed + 1)
        with torch.no_grad():
            expected = module(*inputs)
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        got = session.run(None, {name: tensor.numpy() for name, tensor in zip(spec.input_names, inputs)})
        row = {"shape": list(shape)}
        for name, want, have in zip(spec.output_names, expected, got):
            want = want.detach().numpy()
            if want.shape != have.shape:
                row[name] = float("inf")
            else:  # relative to the output's magnitude when it exceeds 1 (e.g. logits)
                scale = max(1.0, float(abs(want).max())) if want.size else 1.0
                row[name] = float(abs(want.astype("float64") - have).max()) / scale if want.size else 0.0
        report.append(row)
    return report


def file_size_mb(path: str) -> float:
    return os.path.getsize(path) / 2**20
