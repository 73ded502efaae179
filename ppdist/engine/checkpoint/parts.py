"""The models inside a weights file: a composite (distillation) checkpoint holds one model per
``Architecture.Models`` entry under its name (``Teacher.backbone...``, ``Student.head...``, in
ppdist and PaddleOCR files alike), a single-model one its stages at the top (``backbone...``).

``path#Name`` chooses the model ``Name`` of a distillation checkpoint where one model's weights are
wanted (``Global.pretrained_model``, ``Architecture.Models.<name>.pretrained``).
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ppdist.modeling.architectures import STAGES

PART_SUFFIX = re.compile(r"^(?P<path>.+)#(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")


def split_part(path: str) -> Tuple[str, Optional[str]]:
    """``"out/distill/best_accuracy#Student"`` -> ``("out/distill/best_accuracy", "Student")``; a path
    without a ``#Name`` suffix, or a weights file that is named so (``path``, ``path.pt`` or
    ``path.pdparams`` exists) -> ``(path, None)``."""
    match = PART_SUFFIX.match(path)
    if not match or any(os.path.isfile(path + ext) for ext in ("", ".pt", ".pdparams")):
        return path, None
    return match["path"], match["name"]


def _names(keys: Iterable[str]) -> List[str]:
    return [key[7:] if key.startswith("module.") else key for key in keys]


def model_parts(keys: Iterable[str]) -> List[str]:
    """The model names of a composite state's ``keys`` (``Teacher`` of ``Teacher.backbone.x``), in
    order of first appearance; empty for a single model's state (its keys start with a stage)."""
    parts: Dict[str, None] = {}
    for key in _names(keys):
        first, _, rest = key.partition(".")
        if first not in STAGES and rest.partition(".")[0] in STAGES:
            parts.setdefault(first, None)
    return list(parts)


def part_state(state: Mapping[str, Any], name: str) -> Dict[str, Any]:
    """The entries of model ``name`` of a composite ``state``, without the ``name.`` prefix."""
    prefix = name + "."
    return {
        key[len(prefix) :]: value
        for key, value in zip(_names(state), state.values())
        if key.startswith(prefix)
    }


def describe(parts: List[str]) -> str:
    """``a distillation checkpoint (models Teacher, Student)`` or ``a single-model checkpoint``."""
    if parts:
        return f"a distillation checkpoint (models {', '.join(parts)})"
    return "a single-model checkpoint"
