"""Export a trained model: weights (EMA when kept), deploy re-parameterisation, ONNX and/or
TorchScript files, ``inference.yml`` and an optional ONNX Runtime parity check."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Dict, Mapping, Sequence, Tuple

import torch
from torch import nn

from ppdist.components import build_model, class_vocabulary
from ppdist.engine import checkpoint as ckpt
from ppdist.engine.checkpoint import weights_source
from ppdist.errors import ConfigError, PPDistError
from ppdist.export.deploy_modules import build_deploy
from ppdist.export.graph_export import OPSET, export_onnx, export_torchscript, file_size_mb, onnx_parity
from ppdist.export.inference_config import write_inference_config
from ppdist.export.submodels import deployed_name, split_model, sub_model_names
from ppdist.modeling.deploy import convert_to_deploy
from ppdist.modeling.input_size import min_input_size
from ppdist.tasks import GraphSpec, get_task, task_of

logger = logging.getLogger("ppdist")
FORMATS = {"onnx": ("onnx",), "torchscript": ("torchscript",), "both": ("onnx", "torchscript")}


def load_trained_model(
    config: Mapping[str, Any], purpose: str = "export"
) -> Tuple[nn.Module, Dict[str, Any]]:
    """The eval-mode model with ``Global.checkpoints`` (or ``pretrained_model``) weights, the EMA
    average when the run kept one, and where they came from. ``purpose`` names the command in the
    message when no weights are given."""
    glob = config["Global"]
    source = weights_source(glob)
    if not source or source == "auto":
        raise ConfigError(f"{purpose} needs trained weights: -o Global.checkpoints=path/to/best_accuracy")
    data = ckpt.load_file(ckpt.checkpoint_path(source))
    model = build_model(config)
    ckpt.load_inference_weights(model, data, source, class_vocabulary(config))
    model.eval()
    return model, {"weights": os.path.abspath(ckpt.checkpoint_path(source)), "ema": bool(data.get("ema"))}


def load_deploy_model(config: Mapping[str, Any], purpose: str = "export") -> Tuple[nn.Module, Dict[str, Any]]:
    """``load_trained_model`` re-parameterised for deployment (RepVGG branches merged)."""
    model, source = load_trained_model(config, purpose)
    convert_to_deploy(model)
    return model, source


def input_spec(spec: GraphSpec) -> list:
    """Graph inputs for inference.yml: -1 for dynamic axes."""
    shapes = {"image": list(spec.example_shapes[0]), "scale_factor": [spec.example_shapes[0][0], 2]}
    rows = []
    for name in spec.input_names:
        shape = shapes[name]
        for axis in spec.dynamic_axes.get(name, {}):
            shape[axis] = -1
        rows.append({"name": name, "shape": shape, "dtype": "float32"})
    return rows


def _parity(
    module: nn.Module,
    spec: GraphSpec,
    model: nn.Module,
    config: Mapping[str, Any],
    path: str,
    task: str,
    exclude_nms: bool,
) -> list:
    """``onnx_parity`` of the exported file; for a graph with a post-process in it (a detector's NMS),
    of the same network exported without it: on random inputs the scores of many anchors tie and
    ONNX Runtime's TopK breaks ties differently from PyTorch's, so the kept boxes are not comparable
    (the NMS graph itself is verified in the tests with distinct scores). A graph that cannot leave
    its post-process out (Faster R-CNN: per-class boxes, scores from a softmax over RoI features,
    rarely tied) is compared whole."""
    if not get_task(task).has_raw_graph(config) or exclude_nms:
        return onnx_parity(path, module, spec)
    raw_module, raw_spec = build_deploy(model, config, exclude_nms=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw_path = os.path.join(tmp, "network.onnx")
        export_onnx(raw_module, raw_spec, raw_path)
        return onnx_parity(raw_path, raw_module, raw_spec)


def export_model(
    config: Mapping[str, Any],
    out_dir: str,
    formats: Sequence[str] = ("onnx", "torchscript"),
    exclude_nms: bool = False,
    check: bool = False,
    tolerance: float = 1e-3,
) -> Dict[str, Any]:
    """Write the model files and inference.yml into ``out_dir``; returns a report (files, parity).

    A composite model (``Architecture.Models``, e.g. a distillation run) is written as one plain
    model per sub-model into ``out_dir/<name>/``; its report holds each one's under ``models`` and
    names the ``deployed`` one (``ppdist.export.submodels``)."""
    task_of(config)  # a clear error for a post-process that cannot be exported, before any loading
    if not sub_model_names(config):
        model, source = load_deploy_model(config)
        return export_single(model, config, out_dir, source, formats, exclude_nms, check, tolerance)
    model, source = load_trained_model(config)
    deployed = deployed_name(config)
    reports = {}
    for name, (part, part_config) in split_model(model, config).items():
        part_dir = os.path.join(out_dir, name)
        logger.info("sub-model %s of Architecture.Models -> %s", name, part_dir)
        info = dict(source, sub_model=name, deployed=name == deployed)
        reports[name] = export_single(
            part, part_config, part_dir, info, formats, exclude_nms, check, tolerance
        )
    logger.info(
        "exported %d sub-models into %s: deploy %s (the %s model, the one tools/eval.py reports; "
        "the other folders are for comparison)",
        len(reports),
        ", ".join(os.path.join(out_dir, name) for name in reports),
        os.path.join(out_dir, deployed),
        deployed,
    )
    report: Dict[str, Any] = {"task": reports[deployed]["task"], "out_dir": out_dir, **source}
    report.update(models=reports, deployed=deployed, deployed_dir=os.path.join(out_dir, deployed))
    if check:
        report["max_abs_diff"] = max(r["max_abs_diff"] for r in reports.values())
    return report


def export_single(
    model: nn.Module,
    config: Mapping[str, Any],
    out_dir: str,
    source: Mapping[str, Any],
    formats: Sequence[str] = ("onnx", "torchscript"),
    exclude_nms: bool = False,
    check: bool = False,
    tolerance: float = 1e-3,
) -> Dict[str, Any]:
    """Export the loaded eval-mode ``model`` of the plain ``config`` into ``out_dir``; ``source``
    (where its weights came from) is recorded in the report and ``inference.yml``."""
    task = task_of(config)
    module, spec = build_deploy(model, config, exclude_nms=exclude_nms)
    os.makedirs(out_dir, exist_ok=True)
    files: Dict[str, str] = {}
    report: Dict[str, Any] = {"task": task, "out_dir": out_dir, **source}
    if "onnx" in formats:
        files["onnx"] = "model.onnx"
        report["onnx_exporter"] = export_onnx(module, spec, os.path.join(out_dir, files["onnx"]))
        logger.info(
            "wrote %s (%.1f MB, %s exporter, opset %d)",
            os.path.join(out_dir, files["onnx"]),
            file_size_mb(os.path.join(out_dir, files["onnx"])),
            report["onnx_exporter"],
            OPSET,
        )
    if "torchscript" in formats:
        files["torchscript"] = "model.pt"
        export_torchscript(module, spec, os.path.join(out_dir, files["torchscript"]))
        logger.info("wrote %s", os.path.join(out_dir, files["torchscript"]))
    export_info = {"torch": str(torch.__version__), "opset": OPSET, "exclude_nms": exclude_nms, **source}
    path = write_inference_config(
        out_dir, task, config, files, input_spec(spec), spec.output_names, export_info, min_input_size(model)
    )
    logger.info("wrote %s", path)
    if check:
        if "onnx" not in files:
            raise ConfigError("--check compares ONNX Runtime with PyTorch: export with --format onnx or both")
        report["parity"] = _parity(
            module, spec, model, config, os.path.join(out_dir, files["onnx"]), task, exclude_nms
        )
        worst = max(v for row in report["parity"] for k, v in row.items() if k != "shape")
        report["max_abs_diff"] = worst
        for row in report["parity"]:
            logger.info(
                "check %s: %s",
                row["shape"],
                ", ".join(f"{k} max |diff| {v:.3g}" for k, v in row.items() if k != "shape"),
            )
        if worst > tolerance:
            raise PPDistError(f"{out_dir}: ONNX Runtime and PyTorch differ by {worst:.3g} > {tolerance:g}")
    report["files"] = files
    return report
