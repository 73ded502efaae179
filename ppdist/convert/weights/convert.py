"""Paddle state dict (names -> numpy arrays) -> ppdist state dict for a given model.

Every tensor of the ppdist model is looked up under the Paddle name(s) ``naming`` gives it, put
into PyTorch's layout (Linear weights are stored ``[in, out]`` by Paddle) and cast to the model's
dtype. Nothing is guessed from shapes or order: a tensor whose name is absent is reported
missing, a tensor whose shape differs (e.g. a head trained for another class count) is skipped
and listed, as PaddleDetection does when fine-tuning, and Paddle tensors no ppdist tensor took
are listed as unused. Frozen constants that ppdist derives instead of storing (``PaddleNames.constants``,
e.g. PP-YOLOE's DFL projection) are checked against the model's values: equal, they count as used;
different, they are listed as skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from ppdist.convert.weights.naming import paddle_candidates, stage_constants, stage_renames
from ppdist.convert.weights.pdparams import load_pdparams

logger = logging.getLogger("ppdist")
NOT_IN_PADDLE = ("num_batches_tracked",)  # PyTorch-only BatchNorm counter: kept as the model has it


@dataclass
class ConversionReport:
    """What a conversion did, tensor by tensor."""

    source: str
    total: int = 0
    loaded: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)  # "key: file (shape) vs model (shape)"
    missing: List[str] = field(default_factory=list)  # ppdist keys with no Paddle tensor
    unused: List[str] = field(default_factory=list)  # Paddle keys no ppdist tensor took

    @property
    def complete(self) -> bool:
        """Every tensor of the model came from the file."""
        return not self.skipped and not self.missing

    def lines(self, limit: int = 30) -> List[str]:
        out = [f"{self.source}: converted {len(self.loaded)}/{self.total} tensors"]
        for title, items in (
            ("skipped (shape mismatch)", self.skipped),
            ("not in the file, kept as initialised", self.missing),
            ("in the file, not used by this model", self.unused),
        ):
            if items:
                shown = ", ".join(items[:limit]) + (
                    f" ... (+{len(items) - limit})" if len(items) > limit else ""
                )
                out.append(f"  {title} ({len(items)}): {shown}")
        return out

    def log(self) -> None:
        first, *rest = self.lines()
        logger.info(first)
        for line in rest:
            logger.warning(line)


def to_ppdist_layout(
    owner: nn.Module, leaf: str, array: np.ndarray, target: torch.Tensor
) -> Optional[torch.Tensor]:
    """``array`` as a tensor shaped like ``target``, or None when its shape does not fit."""
    value = torch.from_numpy(np.ascontiguousarray(array))
    if isinstance(owner, nn.Linear) and leaf == "weight" and value.dim() == 2:
        value = value.t()  # Paddle's Linear weight is [in, out]
    if tuple(value.shape) != tuple(target.shape):
        return None
    return value.to(dtype=target.dtype).contiguous()


def _strip_stage_prefix(name: str) -> str:
    return name.split(".", 1)[1] if "." in name else name


def convert_state_dict(
    model: nn.Module, paddle_state: Mapping[str, np.ndarray], source: str, stage: Optional[str] = None
) -> Tuple[Dict[str, torch.Tensor], ConversionReport]:
    """ppdist-named tensors for ``model`` (or its ``stage``, e.g. ``"backbone"``) from ``paddle_state``.

    With ``stage``, keys are those of the stage (no ``backbone.`` prefix) and the file may hold
    either the stage alone (an ImageNet backbone) or a whole model.
    """
    renames = stage_renames(model)
    target_module = model.get_submodule(stage) if stage else model
    own = target_module.state_dict()
    report = ConversionReport(source=source)
    state: Dict[str, torch.Tensor] = {}
    used = set()
    for key, target in own.items():
        if key.rpartition(".")[2] in NOT_IN_PADDLE:
            state[key] = target.clone()
            continue
        report.total += 1
        full_key = f"{stage}.{key}" if stage else key
        candidates = paddle_candidates(model, full_key, renames)
        if stage:
            candidates += [_strip_stage_prefix(name) for name in candidates]
        found = next((name for name in candidates if name in paddle_state), None)
        if found is None:
            report.missing.append(key)
            continue
        used.update(name for name in candidates if name in paddle_state)  # aliases of one tensor
        parent, _, leaf = full_key.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        value = to_ppdist_layout(owner, leaf, paddle_state[found], target)
        if value is None:
            report.skipped.append(
                f"{key}: file {tuple(paddle_state[found].shape)} ({found}) vs model {tuple(target.shape)}"
            )
            continue
        state[key] = value
        report.loaded.append(key)
    for name, attribute, value in stage_constants(model, stage):  # frozen tensors ppdist derives itself
        candidates = [name] + ([_strip_stage_prefix(name)] if stage else [])
        found = next((candidate for candidate in candidates if candidate in paddle_state), None)
        if found is None:
            continue
        used.add(found)
        array = np.asarray(paddle_state[found], dtype=np.float64).reshape(-1)
        expected = value.detach().cpu().double().numpy().reshape(-1)
        if array.shape != expected.shape or not np.allclose(array, expected, rtol=0.0, atol=1e-6):
            report.skipped.append(
                f"{attribute}: file {found} {tuple(paddle_state[found].shape)} holds other values "
                f"than this model's fixed {attribute} ({tuple(value.shape)})"
            )
    report.unused = [name for name in paddle_state if name not in used]
    return state, report


def load_paddle_weights(
    model: nn.Module, path: str, stage: Optional[str] = None
) -> Tuple[Dict[str, torch.Tensor], ConversionReport]:
    """``convert_state_dict`` of the ``.pdparams`` / ``.pdema`` file at ``path``."""
    return convert_state_dict(model, load_pdparams(path), path, stage)


def paddle_key_table(model: nn.Module) -> List[Tuple[str, Sequence[str]]]:
    """(ppdist key, Paddle candidates) for every tensor of ``model``: the mapping, for docs and debugging."""
    renames = stage_renames(model)
    return [
        (key, paddle_candidates(model, key, renames))
        for key in model.state_dict()
        if key.rpartition(".")[2] not in NOT_IN_PADDLE
    ]
