"""Inference over image files: the inference info of a training config (what an export would write
in ``inference.yml``), the image files of an ``--input``, and the task's runner (``ppdist.tasks``:
read + preprocess a file, batch samples into the graph's named inputs, turn the graph's named
outputs into per-image results). The runners are backend-agnostic (``ppdist.inference.backends``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping

from ppdist.errors import ConfigError
from ppdist.export.inference_config import inference_postprocess, inference_preprocess
from ppdist.export.submodels import deployed_config
from ppdist.tasks import get_task
from ppdist.tasks.runner import Runner

logger = logging.getLogger("ppdist")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")


def inference_info_from_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The inference info of ``config`` as ``read_inference_config`` would return it after an
    export (task, inputs, outputs, preprocess, postprocess, labels), without writing files; the rec
    dictionary stays the config's ``character_dict_path``. A composite (distillation) model's info
    is that of its deployed sub-model (``ppdist.export.submodels``)."""
    config = deployed_config(config)
    task = get_task(config)
    info: Dict[str, Any] = {
        "task": task.name,
        "files": {},
        "inputs": [{"name": n} for n in task.inputs],
        "outputs": list(task.outputs),
        "preprocess": inference_preprocess(config),
        "postprocess": inference_postprocess(config),
    }
    labels = task.config_labels(config)
    if labels is not None:
        info["labels"] = labels
    return info


def list_images(path: str) -> List[str]:
    """``path`` itself when it is a file, else the image files directly in the folder (sorted)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise ConfigError(f"--input: no such file or directory: {path}")
    names = sorted(n for n in os.listdir(path) if n.lower().endswith(IMAGE_EXTENSIONS))
    broken = [
        n
        for n in names
        if os.path.islink(os.path.join(path, n)) and not os.path.exists(os.path.join(path, n))
    ]
    for name in broken:
        logger.warning("--input: skipped %s: a link to a file that does not exist", os.path.join(path, name))
    return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]


def build_runner(info: Mapping[str, Any]) -> Runner:
    """The runner of ``info["task"]``."""
    return get_task(info["task"]).runner(info)
