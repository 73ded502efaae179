"""Where each ppdist tensor lives in a Paddle state dict: per-stage names and per-layer rules.

A ppdist key such as ``head.stem_cls.0.fc.weight`` is turned into the Paddle key(s) it may be
stored under in two steps:

1. the ``paddle_names`` declared by the class of the model stage it belongs to
   (``ppdist.modeling.paddle_names.PaddleNames``; e.g. PP-YOLOE's head is ``yolo_head`` in
   PaddleDetection), applied to the whole key;
2. the rules of the layer that owns the tensor, by layer type: BatchNorm's running statistics
   are ``_mean`` / ``_variance``; an LSTM's tensors have a flat name (``weight_ih_l0_reverse``)
   and a per-cell one (``0.cell_bw.weight_ih``) — Paddle writes both, older files only one.

Layouts (Linear weights stored ``[in, out]``) are the job of ``convert.to_ppdist_layout``.

ppdist's CRNN stages (``MobileNetV3``, ``SequenceEncoder``, ``CTCHead``) keep PaddleOCR's attribute
names (``backbone.conv1``, ``backbone.blocks.N.{expand_conv, bottleneck_conv, mid_se, linear_conv}``,
``backbone.conv2``, ``neck.encoder.lstm``, ``head.fc``), so only the per-layer rules apply to them;
tests/convert/test_rec_equivalence.py checks this against PaddleOCR's own model. PP-OCRv3's stages
(``MobileNetV1Enhance``, ``MultiHead`` with its svtr ``ctc_encoder``, ``ctc_head`` and ``sar_head``)
keep PaddleOCR's names as well, and a ``DistillationModel`` holds its models as attributes named like
Paddle's (``Student.backbone.conv1._conv.weight``), so its keys are Paddle's with no rename
(tests/convert/test_ppocrv3_weights.py). Declared ``paddle_names`` apply to the stages of a plain
model only (``stage_renames`` looks at the model's own ``backbone``/``neck``/``head``).

Some Paddle tensors are frozen constants that a ppdist stage derives itself instead of storing
(PP-YOLOE's DFL projection ``yolo_head.proj_conv.weight``, 0..reg_max). ``PaddleNames.constants``
names them; the converter compares the file's values with the stage's and reports a difference.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ppdist.modeling.paddle_names import PaddleNames

STAGES = ("backbone", "neck", "head")
StageNames = Dict[str, PaddleNames]  # stage attribute of the model ("head") -> its declaration
_LSTM_NAME = re.compile(r"^(weight_ih|weight_hh|bias_ih|bias_hh)_l(\d+)(_reverse)?$")


def stage_renames(model: nn.Module) -> StageNames:
    """The ``paddle_names`` declared by the classes of ``model``'s stages (``backbone``, ``neck``, ``head``)."""
    found: StageNames = {}
    for stage in STAGES:
        names = getattr(getattr(model, stage, None), "paddle_names", None)
        if isinstance(names, PaddleNames):
            found[stage] = names
    return found


def apply_renames(key: str, renames: StageNames) -> str:
    """``key`` (a ppdist key of the whole model) as its stage's Paddle names have it."""
    stage, dot, inner = key.partition(".")
    names = renames.get(stage)
    if names is None or not dot:
        return key
    for pattern, replacement in names.renames:
        inner = re.sub(pattern, replacement, inner)
    if inner.partition(".")[0] in names.beside_stage:
        return inner
    return f"{names.prefix or stage}.{inner}"


def stage_constants(model: nn.Module, stage: Optional[str] = None) -> List[Tuple[str, str, Tensor]]:
    """``(Paddle key, ppdist attribute path, value)`` of the declared constants of ``model``'s
    stages (or only of ``stage``)."""
    renames = stage_renames(model)
    found = []
    for name in (stage,) if stage else STAGES:
        names = renames.get(name)
        if names is None:
            continue
        module = getattr(model, name)
        for key, attribute in names.constants:
            value = getattr(module, attribute, None)
            if isinstance(value, Tensor):
                found.append((apply_renames(f"{name}.{key}", renames), f"{name}.{attribute}", value))
    return found


def layer_candidates(owner: nn.Module, parent: str, leaf: str) -> List[str]:
    """Paddle names of ``owner``'s tensor ``leaf`` (``parent`` is the owner's Paddle path)."""
    prefix = parent + "." if parent else ""
    if isinstance(owner, _BatchNorm):  # 1d/2d/3d, torch's and ppdist's SyncBatchNorm
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


def paddle_candidates(model: nn.Module, key: str, renames: StageNames) -> List[str]:
    """Every Paddle key the ppdist tensor ``key`` of ``model`` may be stored under, best first."""
    parent = key.rpartition(".")[0]
    owner = model.get_submodule(parent) if parent else model
    renamed_parent, _, renamed_leaf = apply_renames(key, renames).rpartition(".")
    return layer_candidates(owner, renamed_parent, renamed_leaf)
