"""Validate a resolved config before any process group or data is touched.

``validate`` checks every section against the schema and the component registries (each entry's
keywords against its constructor's signature), fills the defaults, and raises ``ConfigError``
with the key path and the closest valid names on the first problem.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Dict, Mapping, Optional, Sequence

from ppdist.config.inject import component_kwargs
from ppdist.config.schema import (
    ARCHITECTURE_KEYS,
    DISTILLATION_KEYS,
    DISTILLATION_MODEL_KEYS,
    LOADER_SCHEMA,
    NONE_TYPE,
    NUMBER_TYPES,
    OPTIMIZER_COMMON_KEYS,
    SECTIONS,
    STAGE_PRETRAINED_KEY,
)
from ppdist.config.trackers import validate_trackers
from ppdist.config.validate_global import check_type, validate_global
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
    TRANSFORMS,
    did_you_mean,
)


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
    check_config = getattr(component, "check_config", None)  # values that must agree with other sections
    if callable(check_config):
        check_config(kwargs, where, config)
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


def _check_loss_list(loss: Mapping[str, Any], config: Mapping[str, Any]) -> None:
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
        component = LOSSES.get(name, f"{where}[{i}]")
        own = {k: v for k, v in params.items() if k not in consumed}
        LOSSES.check(name, own, f"{where}[{i}].{name}")
        check_config = getattr(component, "check_config", None)
        if callable(check_config):
            check_config(own, f"{where}[{i}].{name}", config)


def _check_finite_numbers(value: Any, where: str) -> None:
    """Every number of ``value`` (a Loss section: weights, coefficients, margins) is finite: a
    ``.nan`` / ``.inf`` weight would make every step's loss non-finite."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite_numbers(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite_numbers(item, f"{where}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")


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
            check_type(value, LOADER_SCHEMA[key][0], f"{section}.loader.{key}")
    if loader.get("batch_size_per_card") is None:
        raise ConfigError(f"missing required key {section}.loader.batch_size_per_card")
    if loader["batch_size_per_card"] <= 0:
        raise ConfigError(f"{section}.loader.batch_size_per_card must be > 0")
    for key, (_, default) in LOADER_SCHEMA.items():
        if loader.get(key) is None:
            loader[key] = default
    part["loader"] = loader


FLOAT32_MAX = 3.4028234663852886e38
LR_VALUE_KEYS = ("learning_rate", "end_lr", "eta_min", "warmup_start_lr")  # as ppdist.optim's


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
    check_type(opt.get("fused"), (bool, NONE_TYPE), "Optimizer.fused")
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
        check_type(lr, NUMBER_TYPES, "Optimizer.lr")
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
            check_type(opt[key], NUMBER_TYPES, f"Optimizer.{key}")


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
    check_type(arch.get("return_all_feats"), (bool, NONE_TYPE), f"{where}.return_all_feats")
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
        check_type(model.get("freeze_params"), (bool, NONE_TYPE), f"{where}.freeze_params")
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
    validate_global(config)
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
    _check_loss_list(config["Loss"], config)
    _check_finite_numbers(config["Loss"], "Loss")
    _validate_optimizer(config)
    if config.get("Train") is None and config.get("Eval") is None:
        raise ConfigError("the config needs a Train and/or an Eval section")
    for section in ("Train", "Eval"):
        _validate_data_section(config, section)
    return config
