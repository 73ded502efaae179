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
from ppdist.engine.checkpoint.parts import describe, model_parts, part_state, split_part
from ppdist.errors import CheckpointError, CheckpointPathError, ConfigError

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
    others (``classes.check_classes``: a dictionary of the same size but other characters). A
    distillation checkpoint for one model, or the reverse, is refused saying which kind of
    checkpoint it is and which config fits it."""
    kind = kind_mismatch(model, data)
    if kind is not None:
        raise ConfigError(f"{source} is {kind}")
    check_classes(data.get(CLASSES_KEY), classes, source)
    state = weights_for(model, data, source, prefer_ema=True)
    _, mismatched, missing = load_matching_weights(model, state, source)
    if mismatched or missing:
        raise ConfigError(
            f"{source} does not fit Architecture: {len(mismatched)} shape mismatch(es), "
            f"{len(missing)} missing tensor(s) (see the warnings above)"
            f"{class_count_hint(model.state_dict(), state, classes)}"
        )


def file_state(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The tensors of what ``load_file`` read, by their names in the file: a Paddle file's arrays,
    else the model weights (the EMA weights have the same names)."""
    return data[PADDLE_KEY] if PADDLE_KEY in data else extract_model_state(data)


def kind_mismatch(model: nn.Module, data: Mapping[str, Any]) -> Optional[str]:
    """When ``data`` (read by ``load_file``) is a distillation checkpoint and ``model`` one model, or
    the reverse: what the file is and which config fits it, to follow "<file> is "; else None."""
    state = file_state(data)
    held, own = model_parts(state), model_parts(model.state_dict())
    if not state or bool(held) == bool(own):
        return None
    stored = (
        "; its config is stored in it (and as config.yml in its run folder)"
        if isinstance(data.get("config"), Mapping)
        else ""
    )
    if held:
        return (
            f"{describe(held)} and Architecture is one model: use the distillation config it was "
            f"trained with (Architecture.Models: {', '.join(held)}){stored}"
        )
    fits = (
        []
        if PADDLE_KEY in data
        else [n for n in own if mismatch_summary(model.get_submodule(n), state) is None]
    )
    fitting = f" (its tensors fit Architecture.Models.{' and '.join(fits)})" if fits else ""
    return (
        f"{describe(held)} and Architecture is a distillation model of {', '.join(own)}: use a config "
        f"with one model, the one it was trained with{fitting}{stored}"
    )


def select_part(data: Mapping[str, Any], name: str, where: str) -> Dict[str, Any]:
    """``data`` (read by ``load_file``) narrowed to model ``name`` of a distillation checkpoint: its
    Paddle arrays, or its model and EMA weights, without the ``name.`` prefix. A file without such a
    model is a ``ConfigError`` naming ``where`` and the models it holds."""
    held = model_parts(file_state(data))
    if name not in held:
        hint = f"choose one with #{held[-1]}" if held else f"give the path without #{name}"
        raise ConfigError(f"{where}: {describe(held)}, with no model {name!r} in it; {hint}")
    if PADDLE_KEY in data:
        return {PADDLE_KEY: part_state(data[PADDLE_KEY], name)}
    chosen: Dict[str, Any] = {"model": part_state(extract_model_state(data), name)}
    ema = data.get("ema")
    if isinstance(ema, Mapping) and isinstance(ema.get("module"), Mapping):
        chosen["ema"] = {"module": part_state(ema["module"], name)}
    return chosen


def resolve_weights_path(path: str, key: str) -> str:
    """``checkpoint_path(path)``; a missing file's error names the config ``key`` that gives it."""
    try:
        return checkpoint_path(path)
    except CheckpointPathError as exc:
        raise CheckpointPathError(f"{key}: {exc}") from None


def load_pretrained(
    model: nn.Module, path: str, key: str = "Global.pretrained_model", part: Optional[str] = None
) -> None:
    """``Global.pretrained_model`` (or the config ``key`` naming ``path``): weights only, shape
    mismatches skipped and listed; a file of which nothing fits the model (another task or
    architecture) is an error, not a silent training from scratch.

    ``path#Name`` loads model ``Name`` of a distillation checkpoint; ``part`` (the name of the model
    being loaded, for ``Architecture.Models.<part>.pretrained``) picks that model of a distillation
    checkpoint without a suffix. A whole distillation checkpoint for one model, or a single-model
    one for a distillation model, is an error saying what to give."""
    file, chosen = split_part(path)
    data = load_file(resolve_weights_path(file, key))
    held = model_parts(file_state(data))
    if chosen is None and part is not None and part in held:
        chosen = part
        logger.info("%s %s is %s: loading its %s", key, file, describe(held), part)
    if chosen is not None:
        data = select_part(data, chosen, f"{key} {path}")
    else:
        _refuse_other_kind(model, data, key, path, part)
    loaded, mismatched, missing = load_matching_weights(
        model, weights_for(model, data, path, prefer_ema=False), path
    )
    if not loaded:
        raise ConfigError(
            f"{key} {path}: none of its tensors fits Architecture (0/{len(missing) + len(mismatched)} loaded, "
            f"{len(mismatched)} shape mismatch(es)): it was trained for another model or task; give weights "
            f"of this architecture, or remove {key} to train from scratch"
        )


def _refuse_other_kind(
    model: nn.Module, data: Mapping[str, Any], key: str, path: str, part: Optional[str]
) -> None:
    """A ``ConfigError`` when ``data`` is a whole distillation checkpoint and ``model`` one model, or
    the reverse: what to give instead."""
    held, own = model_parts(file_state(data)), model_parts(model.state_dict())
    if held and not own:
        target = f"with no model named {part}" if part else "and Architecture is one model"
        raise ConfigError(
            f"{key} {path} is a whole {describe(held)[2:]} {target}: choose the model to load with "
            f"a #<name> suffix, e.g. {key}: {path}#{held[-1]}"
        )
    if own and not held and file_state(data):
        raise ConfigError(
            f"{key} {path} is {describe(held)} and Architecture is a distillation model of "
            f"{', '.join(own)}: give it to one of them as Architecture.Models.<name>.{STAGE_PRETRAINED_KEY}"
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
    data = load_file(resolve_weights_path(path, f"Architecture.{stage.capitalize()}.{STAGE_PRETRAINED_KEY}"))
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
        load_pretrained(
            model.get_submodule(part), path, f"Architecture.Models.{part}.{STAGE_PRETRAINED_KEY}", part
        )
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
