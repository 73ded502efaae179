"""Validate the Global section (schema types and choices, defaults filled, the value rules of the
run-wide keys) and read its structured settings: ``compile_options``, ``synthetic_generator``,
``early_stop_settings``, ``auto_scale_lr_base``."""

from __future__ import annotations

import copy
import inspect
import math
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ppdist.config.profiler_options import profiler_settings
from ppdist.config.schema import (
    AMP_ONLY_GLOBAL,
    COMPILE_KEYS,
    GLOBAL_SCHEMA,
    MAX_ACCUMULATE_STEPS,
    NONE_TYPE,
    UNSUPPORTED_GLOBAL,
)
from ppdist.errors import ConfigError
from ppdist.registry import SYNTHETIC_DATA, _type_matches, did_you_mean


def check_type(value: Any, types: Tuple[type, ...], path: str) -> None:
    if not any(_type_matches(value, t) for t in types):
        names = " or ".join("null" if t is NONE_TYPE else t.__name__ for t in types)
        raise ConfigError(f"wrong type for {path}: expected {names}, got {type(value).__name__} ({value!r})")


def compile_options(glob: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """``torch.compile`` keyword arguments from ``Global.compile`` (None when off)."""
    setting = glob.get("compile")
    if not setting:
        return None
    if setting is True:
        return {}
    unknown = sorted(set(setting) - set(COMPILE_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key(s) in Global.compile: {unknown}; expected some of {list(COMPILE_KEYS)} "
            f"(torch.compile's arguments), or true"
        )
    return dict(setting)


def validate_global(config: Dict[str, Any]) -> None:
    glob = config.setdefault("Global", {}) or {}
    if not isinstance(glob, dict):
        raise ConfigError(f"Global must be a mapping of keys (Global: {{epoch_num: ..., ...}}), got {glob!r}")
    config["Global"] = glob
    for key, value in list(glob.items()):
        if key in UNSUPPORTED_GLOBAL:
            if value and (key not in AMP_ONLY_GLOBAL or glob.get("use_amp")):
                raise ConfigError(
                    f"Global.{key} is not supported yet ({UNSUPPORTED_GLOBAL[key]}); "
                    f"remove it or set it to false/empty"
                    + (" (it acts only with Global.use_amp)" if key in AMP_ONLY_GLOBAL else "")
                )
            continue
        if key not in GLOBAL_SCHEMA:
            raise ConfigError(f"unknown key Global.{key}.{did_you_mean(key, GLOBAL_SCHEMA)}")
        spec = GLOBAL_SCHEMA[key]
        if value is None and spec.default is not None and NONE_TYPE not in spec.types:
            glob[key] = value = spec.default  # an empty YAML value means "default"
        check_type(value, spec.types, f"Global.{key}")
        if spec.choices and value not in spec.choices:
            raise ConfigError(f"Global.{key} must be one of {list(spec.choices)}, got {value!r}")
    for key, spec in GLOBAL_SCHEMA.items():
        glob.setdefault(key, copy.deepcopy(spec.default))
    if glob["epoch_num"] is None and glob["max_iters"] is None:
        raise ConfigError("missing required key Global.epoch_num (or Global.max_iters)")
    for key in ("epoch_num", "max_iters"):
        if glob[key] is not None and glob[key] <= 0:
            raise ConfigError(f"Global.{key} must be a positive number, got {glob[key]}")
    if not 0.0 <= float(glob["max_bad_sample_ratio"]) <= 1.0:
        raise ConfigError(
            f"Global.max_bad_sample_ratio must lie in [0, 1] (a fraction of an epoch's samples), got "
            f"{glob['max_bad_sample_ratio']}"
        )
    if not 0.0 <= float(glob["max_skipped_step_ratio"]) <= 1.0:
        raise ConfigError(
            f"Global.max_skipped_step_ratio must lie in [0, 1] (a fraction of the steps of a window), got "
            f"{glob['max_skipped_step_ratio']}"
        )
    compile_options(glob)
    step = glob["eval_batch_step"]
    if isinstance(step, int):
        glob["eval_batch_step"] = [0, step]
    elif len(step) != 2 or not all(isinstance(s, int) for s in step):
        raise ConfigError(f"Global.eval_batch_step must be [start, interval] integers, got {step!r}")
    if glob["eval_batch_step"][1] <= 0:
        raise ConfigError("Global.eval_batch_step interval must be > 0")
    if glob["synthetic_data"]:
        validate_synthetic_spec(glob["synthetic_data"])
    if glob["print_batch_step"] <= 0 or glob["log_smooth_window"] <= 0 or glob["save_epoch_step"] <= 0:
        raise ConfigError("Global.print_batch_step, log_smooth_window and save_epoch_step must be > 0")
    if glob["save_iter_step"] is not None and glob["save_iter_step"] <= 0:
        raise ConfigError(
            f"Global.save_iter_step must be a positive number of steps (or null), got {glob['save_iter_step']}"
        )
    if glob["auto_scale_lr"] is not None:
        _validate_auto_scale_lr(glob["auto_scale_lr"])
    for key in ("accumulate_steps", "keep_checkpoint_max"):
        if glob[key] is not None and glob[key] < 1:
            raise ConfigError(f"Global.{key} must be a positive integer, got {glob[key]}")
    if glob["accumulate_steps"] is not None and glob["accumulate_steps"] > MAX_ACCUMULATE_STEPS:
        raise ConfigError(
            f"Global.accumulate_steps must be a positive integer of at most {MAX_ACCUMULATE_STEPS} "
            f"(micro-batches per optimizer step), got {glob['accumulate_steps']}"
        )
    early_stop_settings(glob)
    profiler_settings(glob)


def synthetic_generator(spec: Mapping[str, Any]) -> Callable[..., Dict[str, Any]]:
    """The data set generator of ``Global.synthetic_data.kind``."""
    kind = spec.get("kind")
    if kind not in SYNTHETIC_DATA:
        raise ConfigError(f"Global.synthetic_data.kind must be one of {SYNTHETIC_DATA.names()}, got {kind!r}")
    return SYNTHETIC_DATA.get(kind)


def validate_synthetic_spec(spec: Mapping[str, Any]) -> None:
    """Check ``{kind, data_dir, ...generator keywords}`` against the generator's signature."""
    generator = synthetic_generator(spec)
    if not spec.get("data_dir"):
        raise ConfigError("missing required key Global.synthetic_data.data_dir")
    params = inspect.signature(generator).parameters
    for key in spec:
        if key in ("kind", "data_dir"):
            continue
        if key not in params or key == "out_dir":
            raise ConfigError(
                f"unknown key Global.synthetic_data.{key}."
                f"{did_you_mean(key, [p for p in params if p != 'out_dir'])}"
            )


def _validate_auto_scale_lr(spec: Mapping[str, Any]) -> None:
    for key in spec:
        if key not in ("base_batch_size", "enable"):
            raise ConfigError(
                f"unknown key Global.auto_scale_lr.{key}.{did_you_mean(key, ['base_batch_size', 'enable'])}"
            )
    base = spec.get("base_batch_size")
    if not isinstance(base, int) or isinstance(base, bool) or base <= 0:
        raise ConfigError(
            f"Global.auto_scale_lr.base_batch_size must be a positive integer (the global batch the "
            f"learning rate was tuned for), got {base!r}"
        )
    if not isinstance(spec.get("enable", True), bool):
        raise ConfigError(f"Global.auto_scale_lr.enable must be true or false, got {spec['enable']!r}")


def early_stop_settings(glob: Mapping[str, Any]) -> Optional[Tuple[int, float]]:
    """``(patience, min_delta)`` of ``Global.early_stop`` (None when off), validated."""
    spec = glob.get("early_stop")
    if not spec:
        return None
    for key in spec:
        if key not in ("patience", "min_delta"):
            raise ConfigError(
                f"unknown key Global.early_stop.{key}.{did_you_mean(key, ['patience', 'min_delta'])}"
            )
    patience, min_delta = spec.get("patience"), spec.get("min_delta", 0.0)
    if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
        raise ConfigError(
            f"Global.early_stop.patience must be a positive integer (evaluations without improvement), "
            f"got {patience!r}"
        )
    if (
        not isinstance(min_delta, (int, float))
        or isinstance(min_delta, bool)
        or not math.isfinite(min_delta)
        or min_delta < 0
    ):
        raise ConfigError(f"Global.early_stop.min_delta must be a finite number >= 0, got {min_delta!r}")
    return patience, float(min_delta)


def auto_scale_lr_base(glob: Mapping[str, Any]) -> Optional[int]:
    """``Global.auto_scale_lr.base_batch_size`` when LR scaling is on, else None."""
    spec = glob.get("auto_scale_lr")
    if not spec or not spec.get("enable", True):
        return None
    return int(spec["base_batch_size"])
