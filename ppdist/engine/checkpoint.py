"""Atomic checkpoint files, safe loading, RNG-state capture and pretrained-weight loading.

A checkpoint is one ``<name>.pt`` file written by global rank 0 as ``<name>.pt.tmp`` then
``os.replace``d, so a kill at any moment leaves either the old or the new file. Files are
read with ``torch.load(weights_only=True)``: only tensors and plain Python containers.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from ppdist.config import STAGE_PRETRAINED_KEY
from ppdist.convert.weights.convert import ConversionReport, convert_state_dict, load_paddle_weights
from ppdist.convert.weights.pdparams import is_paddle_weights, load_pdparams
from ppdist.engine.dist import DistEnv, all_gather_object, broadcast_object
from ppdist.errors import CheckpointError, ConfigError
from ppdist.utils.atomic import torch_save_atomic

logger = logging.getLogger("ppdist")
SUFFIX = ".pt"
PADDLE_SUFFIX = ".pdparams"
PADDLE_KEY = "paddle_state_dict"  # load_file's wrapper of a Paddle file's arrays


def checkpoint_path(prefix_or_path: str) -> str:
    """``output/x/best_accuracy`` or ``.../best_accuracy.pt`` -> the existing ``.pt`` path; a Paddle
    prefix (``.../best_accuracy`` with ``best_accuracy.pdparams`` beside it) -> the ``.pdparams``."""
    if prefix_or_path.endswith(SUFFIX) or is_paddle_weights(prefix_or_path):
        candidates = [prefix_or_path]
    else:
        candidates = [prefix_or_path + SUFFIX, prefix_or_path, prefix_or_path + PADDLE_SUFFIX]
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise CheckpointError(f"checkpoint not found: {prefix_or_path} (looked for {', '.join(candidates)})")


def save_atomic(obj: Mapping[str, Any], path: str) -> None:
    """``torch.save`` to a temporary file beside ``path``, flush to disk, then atomically replace ``path``."""
    torch_save_atomic(dict(obj), path)


def load_file(path: str) -> Dict[str, Any]:
    """Load a checkpoint or state dict safely (``weights_only=True``) onto the CPU.

    A Paddle weights file (``.pdparams`` / ``.pdema``) is read without running code and returned
    as ``{PADDLE_KEY: {paddle name: array}}``; ``weights_for`` converts it for a given model.
    """
    if is_paddle_weights(path):
        return {PADDLE_KEY: load_pdparams(path)}
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"cannot load {path}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a dict (got {type(data).__name__})")
    return data


def saved_global_step(state: Mapping[str, Any]) -> int:
    """The global step a checkpoint was written at (-1 for weights only), in today's layout or
    in that of ppdist 0.1 (position at the top level)."""
    return int((state.get("position") or state).get("global_step", -1))


def load_across_ranks(
    path: str, env: DistEnv, missing_ok: bool = False
) -> Optional[Tuple[Dict[str, Any], str]]:
    """``(state, source)`` of ``path`` on every process, whichever of them have the file.

    Checkpoints are written to global rank 0's disk only, and after a restart rank 0 may sit on
    another node (c10d rendezvous), so without a shared filesystem some processes have no copy or
    an older one. Every process reads its own; the newest (highest ``global_step``) wins and is
    broadcast to the processes that lack it. All processes take the same decision: the same
    error, or None when no process has the file and ``missing_ok``.
    """
    state: Optional[Dict[str, Any]] = None
    missing = error = None
    try:
        resolved = checkpoint_path(path)
    except CheckpointError as exc:
        missing = str(exc)
    else:
        try:
            state = load_file(resolved)
        except CheckpointError as exc:
            error = str(exc)
    step = saved_global_step(state) if state is not None else None
    views = all_gather_object((step, error, missing), env)
    errors = [(rank, view[1]) for rank, view in enumerate(views) if view[1]]
    if errors:
        rank, message = errors[0]
        raise CheckpointError(message if not env.distributed else f"rank {rank}: {message}")
    steps = [view[0] for view in views]
    if all(s is None for s in steps):
        if missing_ok:
            return None
        raise CheckpointError(views[0][2])
    newest = max(s for s in steps if s is not None)
    if all(s == newest for s in steps):
        return state, path
    source_rank = steps.index(newest)
    received = broadcast_object(state if env.rank == source_rank else None, env, src=source_rank)
    logger.info(
        "checkpoint %s (global_step %d) found on %d of %d processes; sent from rank %d to the others",
        path,
        newest,
        sum(s == newest for s in steps),
        env.world_size,
        source_rank,
    )
    return received, f"{path} (from rank {source_rank})"


# --------------------------------------------------------------------------- weights
def extract_model_state(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The model weights inside a ppdist checkpoint, or the dict itself if it is a state dict."""
    if "model" in data and isinstance(data["model"], Mapping):
        return data["model"]
    if "state_dict" in data and isinstance(data["state_dict"], Mapping):
        return data["state_dict"]
    return data


def upgrade_legacy_keys(model: nn.Module, state: Dict[str, Any]) -> Dict[str, Any]:
    """``state`` with keys that older ppdist versions wrote renamed, by each module that defines
    ``upgrade_legacy_keys(state, prefix)`` (also a load_state_dict pre-hook of those modules)."""
    for name, module in model.named_modules():
        upgrade = getattr(module, "upgrade_legacy_keys", None)
        if callable(upgrade):
            upgrade(state, f"{name}." if name else "")
    return state


def load_matching_weights(
    model: nn.Module, state: Mapping[str, Any], source: str
) -> Tuple[List[str], List[str], List[str]]:
    """Copy the tensors whose name and shape match; return (loaded, mismatched, missing).

    Shape mismatches (e.g. a new dictionary size in the head) and missing or unexpected
    keys are listed in the log, never raised, as PaddleOCR's ``pretrained_model`` does.
    """
    own = model.state_dict()
    loaded, mismatched = [], []
    filtered = {}
    state = upgrade_legacy_keys(
        model, {(k[7:] if k.startswith("module.") else k): v for k, v in state.items()}
    )
    for key, value in state.items():
        if key not in own or not isinstance(value, torch.Tensor):
            continue
        if tuple(own[key].shape) != tuple(value.shape):
            mismatched.append(f"{key}: checkpoint {tuple(value.shape)} vs model {tuple(own[key].shape)}")
            continue
        filtered[key] = value
        loaded.append(key)
    missing = [k for k in own if k not in filtered]
    model.load_state_dict(filtered, strict=False)
    logger.info("loaded %d/%d tensors from %s", len(loaded), len(own), source)
    for line in mismatched:
        logger.warning("skipped (shape mismatch) %s", line)
    if missing:
        logger.warning(
            "not in %s, kept as initialised (%d): %s",
            source,
            len(missing),
            ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else ""),
        )
    return loaded, mismatched, missing


def inference_weights(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The weights to evaluate or deploy: the EMA average when the run kept one."""
    ema = data.get("ema")
    return ema["module"] if isinstance(ema, Mapping) and "module" in ema else extract_model_state(data)


def converted_paddle_weights(
    model: nn.Module, data: Mapping[str, Any], source: str, stage: Optional[str] = None
) -> Optional[Mapping[str, Any]]:
    """``model``'s (or its ``stage``'s) tensors converted from a Paddle file read by ``load_file``,
    with the conversion report logged; None when ``data`` is not from a Paddle file."""
    if PADDLE_KEY not in data:
        return None
    state, report = convert_state_dict(model, data[PADDLE_KEY], source, stage)
    report.log()
    if not report.loaded:
        raise CheckpointError(
            f"{source}: none of its {len(data[PADDLE_KEY])} tensors fits "
            f"{'Architecture.' + stage.capitalize() if stage else 'the Architecture'} "
            f"(first file keys: {', '.join(list(data[PADDLE_KEY])[:5])})"
        )
    return state


def weights_for(
    model: nn.Module, data: Mapping[str, Any], source: str, prefer_ema: bool
) -> Mapping[str, Any]:
    """The state dict to load into ``model`` from what ``load_file`` read: a Paddle file converted, else
    the EMA average when kept and ``prefer_ema`` (evaluation, export), else the raw model weights."""
    converted = converted_paddle_weights(model, data, source)
    if converted is not None:
        return converted
    return inference_weights(data) if prefer_ema else extract_model_state(data)


def load_inference_weights(model: nn.Module, data: Mapping[str, Any], source: str) -> None:
    """Put ``weights_for(..., prefer_ema=True)`` into ``model``; every tensor must fit (evaluation and
    export of a trained model, unlike ``pretrained_model``)."""
    _, mismatched, missing = load_matching_weights(
        model, weights_for(model, data, source, prefer_ema=True), source
    )
    if mismatched or missing:
        raise ConfigError(
            f"{source} does not fit Architecture: {len(mismatched)} shape mismatch(es), "
            f"{len(missing)} missing tensor(s) (see the warnings above)"
        )


def load_pretrained(model: nn.Module, path: str) -> None:
    """``Global.pretrained_model``: weights only, shape mismatches skipped and listed."""
    data = load_file(checkpoint_path(path))
    load_matching_weights(model, weights_for(model, data, path, prefer_ema=False), path)


def load_stage_pretrained(model: nn.Module, stage: str, path: str) -> None:
    """``Architecture.Backbone.pretrained``: weights of one stage (e.g. ImageNet backbone weights,
    with or without a ``backbone.`` prefix, Paddle or ppdist); mismatches skipped and listed."""
    data = load_file(checkpoint_path(path))
    module = model.get_submodule(stage)
    state = converted_paddle_weights(model, data, path, stage)
    if state is None:
        prefix = stage + "."
        raw = extract_model_state(data)
        stripped = {k[len(prefix) :]: v for k, v in raw.items() if k.startswith(prefix)}
        state = stripped or raw
    loaded, _, _ = load_matching_weights(module, state, f"{path} ({stage})")
    if not loaded:
        raise CheckpointError(
            f"{path}: no tensor fits Architecture.{stage.capitalize()} (is it a weights "
            f"file for this {stage}?)"
        )


def load_initial_weights(model: nn.Module, config: Mapping[str, Any]) -> bool:
    """A new run's starting weights: ``Architecture.Backbone.pretrained``, then
    ``Global.pretrained_model`` over it (PaddleSeg's order: backbone at build, model after).
    Returns whether any weights were loaded."""
    backbone_weights = ((config.get("Architecture") or {}).get("Backbone") or {}).get(STAGE_PRETRAINED_KEY)
    model_weights = config["Global"].get("pretrained_model")
    if backbone_weights:
        load_stage_pretrained(model, "backbone", backbone_weights)
    if model_weights:
        load_pretrained(model, model_weights)
    return bool(backbone_weights or model_weights)


def write_converted(model: nn.Module, path: str, out: str, stage: Optional[str] = None) -> ConversionReport:
    """Convert the Paddle file ``path`` (or prefix) for ``model`` and save it atomically as a ppdist
    weights file ``{"model": state, "converted_from": ..., "conversion": {...}}``."""
    source = checkpoint_path(path)
    state, report = load_paddle_weights(model, source, stage)
    if not report.loaded:
        raise CheckpointError(
            f"{source}: none of its tensors fits this model "
            f"({len(report.unused)} unused, e.g. {', '.join(report.unused[:5])})"
        )
    if stage:
        state = {f"{stage}.{key}": value for key, value in state.items()}
    save_atomic(
        {
            "model": state,
            "converted_from": os.path.abspath(source),
            "conversion": {"skipped": report.skipped, "missing": report.missing, "unused": report.unused},
        },
        out,
    )
    return report
