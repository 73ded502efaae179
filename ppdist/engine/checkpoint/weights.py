"""Which weights go into a model: the weights source of a run that does not train, a checkpoint's
EMA or raw weights, a Paddle file converted, pretrained and backbone weights (mismatches listed).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from ppdist.config import STAGE_PRETRAINED_KEY
from ppdist.convert.weights.convert import ConversionReport, convert_state_dict, load_paddle_weights
from ppdist.engine.checkpoint.classes import CLASSES_KEY, check_classes, class_count_hint
from ppdist.engine.checkpoint.io import PADDLE_KEY, checkpoint_path, load_file, save_atomic
from ppdist.errors import CheckpointError, ConfigError

logger = logging.getLogger("ppdist")


def weights_source(glob: Mapping[str, Any]) -> Optional[str]:
    """The weights of a run that does not train (evaluation, export, inference, benchmark):
    ``Global.checkpoints``, else ``Global.pretrained_model`` (a path, a prefix or ``auto``; None
    or empty when neither is set)."""
    return glob["checkpoints"] or glob["pretrained_model"]


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
    keys are listed in the log, never raised, as PaddleOCR's ``pretrained_model`` does; a
    mis-shaped tensor is listed once, as a mismatch (``missing``: those the file does not hold).
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
    missing = [k for k in own if not isinstance(state.get(k), torch.Tensor)]  # mis-shaped ones: above
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


def load_inference_weights(
    model: nn.Module, data: Mapping[str, Any], source: str, classes: Optional[Mapping[str, Any]] = None
) -> None:
    """Put ``weights_for(..., prefer_ema=True)`` into ``model``; every tensor must fit (evaluation and
    export of a trained model, unlike ``pretrained_model``). ``classes``: the config's record of what
    the outputs mean (``ppdist.components.class_vocabulary``), refused when the checkpoint recorded
    others (``classes.check_classes``: a dictionary of the same size but other characters)."""
    check_classes(data.get(CLASSES_KEY), classes, source)
    state = weights_for(model, data, source, prefer_ema=True)
    _, mismatched, missing = load_matching_weights(model, state, source)
    if mismatched or missing:
        raise ConfigError(
            f"{source} does not fit Architecture: {len(mismatched)} shape mismatch(es), "
            f"{len(missing)} missing tensor(s) (see the warnings above)"
            f"{class_count_hint(model.state_dict(), state, classes)}"
        )


def load_pretrained(model: nn.Module, path: str, key: str = "Global.pretrained_model") -> None:
    """``Global.pretrained_model`` (or the config ``key`` naming ``path``): weights only, shape
    mismatches skipped and listed; a file of which nothing fits the model (another task or
    architecture) is an error, not a silent training from scratch."""
    data = load_file(checkpoint_path(path))
    loaded, mismatched, missing = load_matching_weights(
        model, weights_for(model, data, path, prefer_ema=False), path
    )
    if not loaded:
        raise ConfigError(
            f"{key} {path}: none of its tensors fits Architecture (0/{len(missing) + len(mismatched)} loaded, "
            f"{len(mismatched)} shape mismatch(es)): it was trained for another model or task; give weights "
            f"of this architecture, or remove {key} to train from scratch"
        )


def mismatch_summary(model: nn.Module, state: Mapping[str, Any]) -> Optional[str]:
    """Why ``state`` (a full model state dict) cannot be loaded into ``model`` exactly, in one line
    (None when it can): counts of missing, unexpected and mis-shaped tensors, with examples."""
    own = model.state_dict()
    state = {(k[7:] if k.startswith("module.") else k): v for k, v in state.items()}
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in own
        if k in state and isinstance(state[k], torch.Tensor) and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if not (missing or unexpected or shapes):
        return None
    parts = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("shape mismatch(es)", shapes)):
        if names:
            parts.append(f"{len(names)} {label} (e.g. {', '.join(names[:2])})")
    return "; ".join(parts)


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
    """A new run's starting weights: the weights the model names for its parts
    (``pretrained_parts``: a distillation model's ``Models.<name>.pretrained``, each loaded into
    that model as ``Global.pretrained_model``), ``Architecture.Backbone.pretrained``, then
    ``Global.pretrained_model`` over them (PaddleOCR's and PaddleSeg's order: parts at build, model
    after). Returns whether any weights were loaded."""
    parts = dict(getattr(model, "pretrained_parts", None) or {})
    for part, path in parts.items():
        load_pretrained(model.get_submodule(part), path, f"Architecture.Models.{part}.pretrained")
    backbone_weights = ((config.get("Architecture") or {}).get("Backbone") or {}).get(STAGE_PRETRAINED_KEY)
    model_weights = config["Global"].get("pretrained_model")
    if backbone_weights is True:
        logger.info(
            f"Architecture.Backbone.{STAGE_PRETRAINED_KEY}: true asks PaddleOCR to download the backbone's "
            "ImageNet weights; ppdist downloads nothing: the backbone starts from its random init "
            "(give a local .pdparams or .pt path there to load weights)"
        )
        backbone_weights = None
    if backbone_weights:
        load_stage_pretrained(model, "backbone", backbone_weights)
    if model_weights:
        load_pretrained(model, model_weights)
    return bool(parts or backbone_weights or model_weights)


def write_converted(
    model: nn.Module, path: str, out: str, stage: Optional[str] = None, min_share: float = 0.0
) -> ConversionReport:
    """Convert the Paddle file ``path`` (or prefix) for ``model`` and save it atomically as a ppdist
    weights file ``{"model": state, "converted_from": ..., "conversion": {...}}``. Nothing is written
    when less than ``min_share`` of the model's tensors were converted (``CheckpointError``)."""
    source = checkpoint_path(path)
    state, report = load_paddle_weights(model, source, stage)
    if not report.loaded:
        raise CheckpointError(
            f"{source}: none of its tensors fits this model "
            f"({len(report.unused)} unused, e.g. {', '.join(report.unused[:5])})"
        )
    if len(report.loaded) < min_share * report.total:
        raise CheckpointError(
            f"{source}: only {len(report.loaded)}/{report.total} tensors of the model converted "
            f"({len(report.skipped)} shape mismatch(es), {len(report.missing)} missing), under "
            f"{min_share:.0%}: weights of another model or config? {out} not written; "
            "--allow_partial writes it anyway"
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
