"""Validate a resolved config before any process group or data is touched.

``validate`` checks every section against the schema and the component registries (each entry's
keywords against its constructor's signature), fills the defaults, and raises ``ConfigError``
with the key path and the closest valid names on the first problem.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ppdist.config.inject import component_kwargs
from ppdist.config.profiler_options import profiler_settings
from ppdist.config.schema import (
    AMP_ONLY_GLOBAL,
    ARCHITECTURE_KEYS,
    COMPILE_KEYS,
    DISTILLATION_KEYS,
    DISTILLATION_MODEL_KEYS,
    GLOBAL_SCHEMA,
    LOADER_SCHEMA,
    MAX_ACCUMULATE_STEPS,
    NONE_TYPE,
    NUMBER_TYPES,
    OPTIMIZER_COMMON_KEYS,
    SECTIONS,
    STAGE_PRETRAINED_KEY,
    UNSUPPORTED_GLOBAL,
)
from ppdist.config.trackers import validate_trackers
from ppdist.errors import ConfigError
from ppdist.registry import (
    ARCHITECTURES,
    BACKBONES,
    DATASETS,
    HEADS,
    HOOKS,
    LOSSES,
    LR_SCHEDULERS,
    METRICS,
    NECKS,
    OPTIMIZERS,
    POSTPROCESSES,
    REGULARIZERS,
    SYNTHETIC_DATA,
    TRANSFORMS,
    _type_matches,
    did_you_mean,
)


def _check_type(value: Any, types: Tuple[type, ...], path: str) -> None:
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


def _validate_global(config: Dict[str, Any]) -> None:
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
        _check_type(value, spec.types, f"Global.{key}")
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


def _check_component(
    registry: Any, entry: Any, where: str, config: Mapping[str, Any], injected: Sequence[str] = ()
) -> None:
    if not isinstance(entry, dict) or "name" not in entry:
        raise ConfigError(f"{where} needs a mapping with a 'name' key, got {entry!r}")
    component = registry.get(entry["name"], f"{where}.name")
    kwargs = component_kwargs(registry, entry, config)
    registry.check(entry["name"], kwargs, where, injected=injected)
    check_values = getattr(component, "check_values", None)  # value rules (SegPostProcess's test_config)
    if callable(check_values):
        check_values(kwargs, where)
    nested = getattr(component, "nested_entries", None)  # components built from inner entries (MultiHead)
    if callable(nested):
        for inner_registry, inner, inner_where, inner_injected in nested(entry, where):
            _check_component(inner_registry, inner, inner_where, config, injected=inner_injected)


def _check_transforms(ops: Any, where: str, config: Mapping[str, Any]) -> None:
    if not isinstance(ops, list):
        raise ConfigError(f"{where} must be a list of {{OpName: params}} entries")
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or len(op) != 1:
            raise ConfigError(f"{where}[{i}] must be a one-key mapping {{OpName: params}}, got {op!r}")
        ((name, params),) = op.items()
        params = params or {}
        if not isinstance(params, dict):
            raise ConfigError(f"{where}[{i}].{name} parameters must be a mapping, got {params!r}")
        _check_component(TRANSFORMS, dict(params, name=name), f"{where}[{i}].{name}", config)


def _check_forwarded_keys(registry: Any, entry: Mapping[str, Any], where: str) -> None:
    """A component that hands its extra keywords to another one (DistillationMetric to its base
    metric) checks them with its ``check_forwarded(kwargs, where)``."""
    check = getattr(registry.get(entry["name"], f"{where}.name"), "check_forwarded", None)
    if check is not None:
        check({k: v for k, v in entry.items() if k != "name"}, where)


def _check_loss_list(loss: Mapping[str, Any]) -> None:
    """The ``{LossName: params}`` entries of a composite loss's ``loss_config_list`` (CombinedLoss,
    MultiLoss): known names and keywords; the keys the composite itself takes from every entry
    (its ``required_entry_keys``, CombinedLoss's ``weight``) must be there."""
    entries = loss.get("loss_config_list")
    if entries is None:
        return
    where = "Loss.loss_config_list"
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{where} must be a non-empty list of {{LossName: params}} entries, got {entries!r}"
        )
    consumed = getattr(LOSSES.get(loss["name"], "Loss.name"), "required_entry_keys", ())
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ConfigError(f"{where}[{i}] must be a one-key mapping {{LossName: params}}, got {entry!r}")
        ((name, params),) = entry.items()
        params = params or {}
        if not isinstance(params, dict):
            raise ConfigError(f"{where}[{i}].{name} parameters must be a mapping, got {params!r}")
        for key in consumed:
            if key not in params:
                raise ConfigError(f"{where}[{i}].{name}.{key} is required by {loss['name']}")
        LOSSES.get(name, f"{where}[{i}]")
        LOSSES.check(name, {k: v for k, v in params.items() if k not in consumed}, f"{where}[{i}].{name}")


def _validate_data_section(config: Dict[str, Any], section: str) -> None:
    part = config.get(section)
    if part is None:
        return
    if not isinstance(part, dict):
        raise ConfigError(f"{section} must be a mapping with 'dataset' and 'loader'")
    for key in part:
        if key not in ("dataset", "loader"):
            raise ConfigError(f"unknown key {section}.{key}.{did_you_mean(key, ['dataset', 'loader'])}")
    dataset = part.get("dataset")
    if not isinstance(dataset, dict) or "name" not in dataset:
        raise ConfigError(f"missing required key {section}.dataset.name")
    DATASETS.get(dataset["name"], f"{section}.dataset.name")
    own = {k: v for k, v in dataset.items() if k not in ("transforms", "batch_transforms")}
    kwargs = component_kwargs(DATASETS, own, config)
    DATASETS.check(dataset["name"], kwargs, f"{section}.dataset", injected=("transforms", "mode", "seed"))
    _check_transforms(dataset.get("transforms") or [], f"{section}.dataset.transforms", config)
    _check_transforms(dataset.get("batch_transforms") or [], f"{section}.dataset.batch_transforms", config)
    loader = part.get("loader") or {}
    if not isinstance(loader, dict):
        raise ConfigError(f"{section}.loader must be a mapping")
    for key, value in loader.items():
        if key not in LOADER_SCHEMA:
            hint = (
                " Custom samplers/collate functions are not supported yet."
                if key in ("sampler", "collate_fn")
                else ""
            )
            raise ConfigError(f"unknown key {section}.loader.{key}.{did_you_mean(key, LOADER_SCHEMA)}{hint}")
        if value is not None:
            _check_type(value, LOADER_SCHEMA[key][0], f"{section}.loader.{key}")
    if loader.get("batch_size_per_card") is None:
        raise ConfigError(f"missing required key {section}.loader.batch_size_per_card")
    if loader["batch_size_per_card"] <= 0:
        raise ConfigError(f"{section}.loader.batch_size_per_card must be > 0")
    for key, (_, default) in LOADER_SCHEMA.items():
        if loader.get(key) is None:
            loader[key] = default
    part["loader"] = loader


FLOAT32_MAX = 3.4028234663852886e38
LR_VALUE_KEYS = ("learning_rate", "end_lr", "eta_min", "warmup_start_lr")  # as engine.optim's


def _check_learning_rates(lr: Any) -> None:
    """Every learning rate of ``Optimizer.lr`` is a finite number a float32 holds (the optimizers
    compute in float32: a larger one fails deep inside torch)."""
    if isinstance(lr, dict):
        values = [(f"Optimizer.lr.{key}", lr[key]) for key in LR_VALUE_KEYS if key in lr]
        if isinstance(lr.get("values"), (list, tuple)):
            values += [(f"Optimizer.lr.values[{i}]", v) for i, v in enumerate(lr["values"])]
    else:
        values = [("Optimizer.lr", lr)]
    for path, value in values:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
                raise ConfigError(
                    f"{path} must be a finite number a float32 holds (at most {FLOAT32_MAX:.4g}), got {value!r}"
                )


def _validate_optimizer(config: Dict[str, Any]) -> None:
    opt = config.get("Optimizer")
    if not isinstance(opt, dict) or "name" not in opt:
        raise ConfigError("missing required key Optimizer.name")
    kwargs = {k: v for k, v in opt.items() if k not in ("name",) + OPTIMIZER_COMMON_KEYS}
    OPTIMIZERS.check(opt["name"], kwargs, "Optimizer", injected=("params", "fused"))
    _check_type(opt.get("fused"), (bool, NONE_TYPE), "Optimizer.fused")
    lr = opt.get("lr")
    if lr is None:
        raise ConfigError("missing required key Optimizer.lr (a number or {name, learning_rate, ...})")
    if isinstance(lr, dict):
        entry = dict(lr)
        entry.setdefault("name", "Const")
        LR_SCHEDULERS.check(
            entry["name"],
            {k: v for k, v in entry.items() if k != "name"},
            "Optimizer.lr",
            injected=("epochs", "step_each_epoch", "total_steps"),
        )
    else:
        _check_type(lr, NUMBER_TYPES, "Optimizer.lr")
    _check_learning_rates(lr)
    reg = opt.get("regularizer")
    if reg:
        if not isinstance(reg, dict) or "name" not in reg:
            raise ConfigError("Optimizer.regularizer needs {name: L2, factor: ...}")
        REGULARIZERS.check(
            reg["name"], {k: v for k, v in reg.items() if k != "name"}, "Optimizer.regularizer"
        )
    for key in ("clip_norm", "clip_norm_global"):
        if opt.get(key) is not None:
            _check_type(opt[key], NUMBER_TYPES, f"Optimizer.{key}")


def _without_stage_pretrained(entry: Dict[str, Any]) -> Dict[str, Any]:
    """``Architecture.Backbone`` minus its ``pretrained`` weights path (checked to be a path, or
    PaddleOCR's boolean: ppdist downloads nothing, the trainer says so in one line)."""
    value = entry[STAGE_PRETRAINED_KEY]
    if value is not None and not isinstance(value, (str, bool)):
        raise ConfigError(
            f"Architecture.Backbone.{STAGE_PRETRAINED_KEY} must be a weights path (.pt or Paddle "
            f".pdparams), true/false (PaddleOCR's download switch) or null, got {value!r}"
        )
    if isinstance(value, str) and value.startswith(("http://", "https://")):
        raise ConfigError(
            f"Architecture.Backbone.{STAGE_PRETRAINED_KEY} is a URL ({value}); ppdist does not "
            f"download weights: download the file and give its local path"
        )
    return {k: v for k, v in entry.items() if k != STAGE_PRETRAINED_KEY}


def _check_freeze_spellings(entry: Dict[str, Any]) -> None:
    """Frozen stages have two spellings (ppdist.modeling.freezing); one of them at most."""
    if entry.get("freeze_at") is not None and entry.get("frozen_stages") is not None:
        raise ConfigError(
            "Architecture.Backbone: give freeze_at (PaddleDetection's: the last frozen stage, from 0) "
            "or frozen_stages (mmdetection's: the stem and that many stages), not both "
            f"(got freeze_at={entry['freeze_at']!r}, frozen_stages={entry['frozen_stages']!r})"
        )


def _validate_model_stages(arch: Dict[str, Any], where: str, config: Dict[str, Any]) -> None:
    """One BaseModel section (``Architecture``, or a ``Models`` entry of a distillation model)."""
    for key in arch:
        if key not in ARCHITECTURE_KEYS:
            raise ConfigError(f"unknown key {where}.{key}.{did_you_mean(key, ARCHITECTURE_KEYS)}")
    if arch.get("name") not in (None, "BaseModel"):
        raise ConfigError(f"{where}.name must be BaseModel (or absent) here, got {arch['name']!r}")
    if arch.get("Transform"):
        raise ConfigError(f"{where}.Transform (e.g. TPS) is not supported yet; set it to null")
    _check_type(arch.get("return_all_feats"), (bool, NONE_TYPE), f"{where}.return_all_feats")
    for key, registry, required in (
        ("Backbone", BACKBONES, True),
        ("Neck", NECKS, False),
        ("Head", HEADS, True),
    ):
        entry = arch.get(key)
        if entry is None and not required:
            continue
        if entry is None:
            raise ConfigError(f"missing required key {where}.{key}")
        if key == "Backbone" and isinstance(entry, dict) and STAGE_PRETRAINED_KEY in entry:
            entry = _without_stage_pretrained(entry)
        if key == "Backbone" and isinstance(entry, dict):
            _check_freeze_spellings(entry)
        _check_component(
            registry,
            entry,
            f"{where}.{key}",
            config,
            injected=("in_channels", "out_channels", "out_channels_list"),
        )


def _validate_distillation(arch: Dict[str, Any], config: Dict[str, Any]) -> None:
    """``Architecture.name: DistillationModel``: its own keys, then each ``Models`` entry as a model."""
    for key in arch:
        if key not in DISTILLATION_KEYS:
            raise ConfigError(
                f"unknown key Architecture.{key} for DistillationModel.{did_you_mean(key, DISTILLATION_KEYS)}"
            )
    models = arch.get("Models")
    if not isinstance(models, dict) or not models:
        raise ConfigError(
            "Architecture.Models must map model names (e.g. Teacher, Student) to architectures "
            "(model_type, Backbone, Head, ...)"
        )
    for name, model in models.items():
        where = f"Architecture.Models.{name}"
        if not isinstance(model, dict):
            raise ConfigError(f"{where} must be a mapping (an architecture), got {model!r}")
        _check_type(model.get("freeze_params"), (bool, NONE_TYPE), f"{where}.freeze_params")
        pretrained = model.get(STAGE_PRETRAINED_KEY)
        if pretrained is not None and not isinstance(pretrained, str):
            raise ConfigError(
                f"{where}.{STAGE_PRETRAINED_KEY} must be a weights path or null, got {pretrained!r}"
            )
        _validate_model_stages(
            {k: v for k, v in model.items() if k not in DISTILLATION_MODEL_KEYS}, where, config
        )


def _validate_architecture(config: Dict[str, Any]) -> None:
    arch = config.get("Architecture")
    if not isinstance(arch, dict):
        raise ConfigError("missing required section Architecture")
    name = arch.get("name", "BaseModel")
    if name not in ARCHITECTURES:
        raise ConfigError(
            f"unknown Architecture.name {name!r}.{did_you_mean(str(name), ARCHITECTURES.names())}"
        )
    if name == "DistillationModel":
        _validate_distillation(arch, config)
    else:
        _validate_model_stages(arch, "Architecture", config)


def import_custom_modules(modules: Optional[Sequence[Any]]) -> None:
    """``Global.custom_imports``: import the user's modules, so that what they register (hooks,
    components) can be named in the config."""
    for i, name in enumerate(modules or ()):
        if not isinstance(name, str) or not name:
            raise ConfigError(
                f"Global.custom_imports[{i}] must be a module name such as my_project.hooks, got {name!r}"
            )
        try:
            importlib.import_module(name)
        except Exception as exc:  # the user's module failing to import, whatever the reason
            raise ConfigError(
                f"Global.custom_imports[{i}]: cannot import {name!r} ({type(exc).__name__}: {exc}); it must be "
                f"importable by every process (on PYTHONPATH)"
            ) from None


def _validate_hooks(config: Dict[str, Any]) -> None:
    for i, entry in enumerate(config["Global"]["hooks"] or []):
        _check_component(HOOKS, entry, f"Global.hooks[{i}]", config)


def validate(config: Dict[str, Any]) -> Dict[str, Any]:
    """Check every section, fill defaults; raise ``ConfigError`` on the first problem."""
    for key in config:
        if key not in SECTIONS:
            raise ConfigError(f"unknown section {key!r}.{did_you_mean(key, SECTIONS)}")
    _validate_global(config)
    validate_trackers(config)
    import_custom_modules(config["Global"]["custom_imports"])
    _validate_hooks(config)
    _validate_architecture(config)
    for section, registry in (("Loss", LOSSES), ("PostProcess", POSTPROCESSES), ("Metric", METRICS)):
        if config.get(section) is None:
            raise ConfigError(f"missing required section {section}")
        _check_component(registry, config[section], section, config)
        _check_forwarded_keys(registry, config[section], section)
    for i, entry in enumerate(config["Loss"].get("types") or []):  # MultiOutputLoss entries
        _check_component(LOSSES, entry, f"Loss.types[{i}]", config)
    _check_loss_list(config["Loss"])
    _validate_optimizer(config)
    if config.get("Train") is None and config.get("Eval") is None:
        raise ConfigError("the config needs a Train and/or an Eval section")
    for section in ("Train", "Eval"):
        _validate_data_section(config, section)
    return config
