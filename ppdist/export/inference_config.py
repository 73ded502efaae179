"""``inference.yml``: everything needed to run an exported model without the training config.

``{ppdist_inference: 1, task, files: {onnx, torchscript}, inputs: [{name, shape}], outputs,
preprocess: [transform entries], postprocess: {name, ...}, labels, export: {...}}``, and
``min_input_size: [height, width]`` when the model cannot take smaller images (the runners skip
them, naming the file); the rec
dictionary is written beside it as ``characters.txt``, the table structure tokens as
``structure_tokens.txt``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import yaml

from ppdist.builder import component_kwargs
from ppdist.errors import ConfigError
from ppdist.registry import POSTPROCESSES, TRANSFORMS
from ppdist.tasks import TASKS, get_task

FORMAT_VERSION = 1
FILE_NAME = "inference.yml"
logger = logging.getLogger("ppdist")
# Eval transforms that only prepare labels; inference has none
LABEL_ONLY_TRANSFORMS = (
    "CTCLabelEncode",
    "MultiLabelEncode",
    "SARLabelEncode",
    "TableLabelEncode",
    "TableBoxEncode",
    "KeepKeys",
)


def inference_preprocess(config: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The Eval transforms minus label-only ones, with the shared Global values they take filled in."""
    steps = []
    for entry in (config.get("Eval") or {}).get("dataset", {}).get("transforms") or []:
        ((name, args),) = entry.items()
        if name not in LABEL_ONLY_TRANSFORMS:
            steps.append({name: component_kwargs(TRANSFORMS, dict(args or {}, name=name), config)})
    return steps


def inference_postprocess(config: Mapping[str, Any]) -> Dict[str, Any]:
    """``PostProcess`` with the shared Global values it takes (e.g. Global.character_dict_path),
    as the training build passes them."""
    entry = config["PostProcess"]
    return {"name": entry["name"], **component_kwargs(POSTPROCESSES, entry, config)}


def write_inference_config(
    out_dir: str,
    task: str,
    config: Mapping[str, Any],
    files: Mapping[str, str],
    inputs: List[Dict[str, Any]],
    outputs: List[str],
    export_info: Mapping[str, Any],
    min_input_size: Optional[Sequence[int]] = None,
) -> str:
    """Write ``out_dir/inference.yml`` (and the rec dictionary / table tokens); returns its path."""
    postprocess = inference_postprocess(config)
    info: Dict[str, Any] = {
        "ppdist_inference": FORMAT_VERSION,
        "task": task,
        "files": dict(files),
        "inputs": inputs,
        "outputs": list(outputs),
        "preprocess": inference_preprocess(config),
        "export": dict(export_info),
    }
    if min_input_size is not None:
        info["min_input_size"] = [int(min_input_size[0]), int(min_input_size[1])]
    info["labels"] = get_task(task).inference_labels(out_dir, config, postprocess)
    info["postprocess"] = postprocess
    path = os.path.join(out_dir, FILE_NAME)
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(info, handle, sort_keys=False, allow_unicode=True)
    return path


def check_min_input_size(value: Any, path: str) -> None:
    """``min_input_size`` is absent or [height, width] of positive integers."""
    if value is None:
        return
    if not (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ConfigError(
            f"{path}: min_input_size must be [height, width] in pixels (positive integers), got "
            f"{value!r}; export the model again"
        )


def read_inference_config(model_dir: str) -> Dict[str, Any]:
    """``model_dir/inference.yml`` checked against what this ppdist understands; file paths made absolute."""
    path = os.path.join(model_dir, FILE_NAME)
    if not os.path.isfile(path):
        raise ConfigError(
            f"{model_dir} is not an exported model directory: {FILE_NAME} not found "
            f"(run tools/export_model.py first)"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            info = yaml.safe_load(handle) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path} is not readable YAML ({type(exc).__name__}); export the model again"
        ) from None
    if not isinstance(info, dict):
        raise ConfigError(f"{path} must be a mapping of keys; export the model again")
    if info.get("ppdist_inference") != FORMAT_VERSION:
        raise ConfigError(
            f"{path}: ppdist_inference is {info.get('ppdist_inference')!r}, this ppdist reads "
            f"version {FORMAT_VERSION}; export the model again with this version"
        )
    for key in ("task", "files", "inputs", "outputs", "preprocess", "postprocess"):
        if key not in info:
            raise ConfigError(f"{path}: missing key {key}")
    check_min_input_size(info.get("min_input_size"), path)
    if info["task"] not in TASKS:
        raise ConfigError(f"{path}: task must be one of {', '.join(TASKS)}, got {info['task']!r}")
    info["files"] = {k: os.path.join(model_dir, v) for k, v in info["files"].items()}
    dict_path: Optional[str] = info["postprocess"].get("character_dict_path")
    if dict_path:
        info["postprocess"]["character_dict_path"] = os.path.join(model_dir, dict_path)
    info["path"] = path
    return info
