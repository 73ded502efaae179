"""Where each ppdist tensor lives in a Paddle state dict: per-stage renames and per-layer rules.

A ppdist key such as ``head.stem_cls.0.fc.weight`` is turned into the Paddle key(s) it may be
stored under in two steps:

1. the renames registered for the class of the model stage it belongs to (``register_renames``;
   e.g. PP-YOLOE's head is ``yolo_head`` in PaddleDetection), applied to the whole key;
2. the rules of the layer that owns the tensor, by layer type: BatchNorm's running statistics
   are ``_mean`` / ``_variance``; an LSTM's tensors have a flat name (``weight_ih_l0_reverse``)
   and a per-cell one (``0.cell_bw.weight_ih``) — Paddle writes both, older files only one.

Layouts (Linear weights stored ``[in, out]``) are the job of ``weights.to_ppdist_layout``.

Some Paddle tensors are frozen constants that a ppdist stage derives itself instead of storing
(PP-YOLOE's DFL projection ``yolo_head.proj_conv.weight``, 0..reg_max). ``register_constants``
names them; the converter compares the file's values with the stage's and reports a difference.
"""

from __future__ import annotations

import importlib
import re
from typing import Dict, List, Optional, Sequence, Tuple

from torch import Tensor, nn

Rename = Tuple[str, str]  # (regular expression on the ppdist key, replacement)
_RENAMES: Dict[str, List[Rename]] = {}
Constant = Tuple[str, str]  # (ppdist-style key inside the stage, the stage attribute holding its value)
_CONSTANTS: Dict[str, List[Constant]] = {}
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
_LSTM_NAME = re.compile(r"^(weight_ih|weight_hh|bias_ih|bias_hh)_l(\d+)(_reverse)?$")


def register_renames(stage_class: str, renames: Sequence[Rename]) -> None:
    """Renames applied to the keys of every stage whose class is named ``stage_class``."""
    _RENAMES.setdefault(stage_class, []).extend(renames)


def register_constants(stage_class: str, constants: Sequence[Constant]) -> None:
    """Paddle tensors that stages of class ``stage_class`` compute rather than store: each is
    ``(key, attribute)``, ``key`` written like a ppdist key inside the stage (the stage's renames
    then give the Paddle name, e.g. ``proj_conv.weight``) and ``attribute`` the stage's tensor
    holding the same values (any shape with as many elements, e.g. a non-persistent buffer)."""
    _CONSTANTS.setdefault(stage_class, []).extend(constants)


def stage_constants(model: nn.Module, stage: Optional[str] = None) -> List[Tuple[str, str, Tensor]]:
    """``(Paddle key, ppdist attribute path, value)`` of the registered constants of ``model``'s
    stages (or only of ``stage``)."""
    renames = stage_renames(model)
    found = []
    for name in (stage,) if stage else ("backbone", "neck", "head"):
        module = getattr(model, name, None)
        if not isinstance(module, nn.Module):
            continue
        for key, attribute in _CONSTANTS.get(type(module).__name__, ()):
            value = getattr(module, attribute, None)
            if isinstance(value, Tensor):
                found.append((apply_renames(f"{name}.{key}", renames), f"{name}.{attribute}", value))
    return found


def stage_renames(model: nn.Module) -> List[Rename]:
    """The renames of ``model``'s stages (``backbone``, ``neck``, ``head``), in that order."""
    renames: List[Rename] = []
    for stage in ("backbone", "neck", "head"):
        module = getattr(model, stage, None)
        if isinstance(module, nn.Module):
            renames.extend(_RENAMES.get(type(module).__name__, ()))
    return renames


def layer_candidates(owner: nn.Module, parent: str, leaf: str) -> List[str]:
    """Paddle names of ``owner``'s tensor ``leaf`` (``parent`` is the owner's Paddle path)."""
    prefix = parent + "." if parent else ""
    if isinstance(owner, _BATCH_NORMS):
        leaf = {"running_mean": "_mean", "running_var": "_variance"}.get(leaf, leaf)
    elif isinstance(owner, (nn.LSTM, nn.GRU)):
        match = _LSTM_NAME.match(leaf)
        if match:
            kind, layer, reverse = match.groups()
            if owner.bidirectional:
                cell = "cell_bw" if reverse else "cell_fw"
            else:
                cell = "cell"
            return [prefix + leaf, f"{prefix}{layer}.{cell}.{kind}"]
    return [prefix + leaf]


def apply_renames(key: str, renames: Sequence[Rename]) -> str:
    for pattern, replacement in renames:
        key = re.sub(pattern, replacement, key)
    return key


def paddle_candidates(model: nn.Module, key: str, renames: Sequence[Rename]) -> List[str]:
    """Every Paddle key the ppdist tensor ``key`` of ``model`` may be stored under, best first."""
    parent = key.rpartition(".")[0]
    owner = model.get_submodule(parent) if parent else model
    renamed_parent, _, renamed_leaf = apply_renames(key, renames).rpartition(".")
    return layer_candidates(owner, renamed_parent, renamed_leaf)


def _load_family_renames() -> None:
    """Import the per-family rename tables (they call ``register_renames``)."""
    for family in ("names_rec", "names_det", "names_seg"):
        importlib.import_module(f"ppdist.convert.weights.{family}")


_load_family_renames()
