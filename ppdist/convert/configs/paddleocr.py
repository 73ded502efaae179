"""PaddleOCR config -> ppdist config: ppdist reads PaddleOCR's schema, so the sections pass through.

Keys, options and transforms ppdist does not have are removed and listed; a relative path that
only exists inside the PaddleOCR checkout (e.g. ``ppocr/utils/ppocr_keys_v1.txt``) is rewritten
to that location when the config is read from the checkout.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, List

from ppdist.config import (
    AMP_ONLY_GLOBAL,
    ARCHITECTURE_KEYS,
    DISTILLATION_KEYS,
    DISTILLATION_MODEL_KEYS,
    GLOBAL_SCHEMA,
    LOADER_SCHEMA,
    OPTIMIZER_COMMON_KEYS,
    SECTIONS,
    STAGE_PRETRAINED_KEY,
    UNSUPPORTED_GLOBAL,
    load_yaml_with_bases,
)
from ppdist.convert.configs.common import PADDLEOCR, Conversion, Report, fix_path
from ppdist.errors import ConfigError
from ppdist.registry import (
    BACKBONES,
    DATASETS,
    HEADS,
    LOSSES,
    LR_SCHEDULERS,
    METRICS,
    NECKS,
    OPTIMIZERS,
    POSTPROCESSES,
    TRANSFORMS,
)

GLOBAL_PATH_KEYS = ("character_dict_path",)


def convert_ocr(path: str) -> Conversion:
    """The ppdist config of the PaddleOCR config ``path`` (sections kept, unsupported keys removed)."""
    report = Report()
    config = copy.deepcopy(load_yaml_with_bases(path))
    for key in list(config):
        if key not in SECTIONS:
            report.unmapped_key(key, "not a ppdist section", config.pop(key))
    _global(config.setdefault("Global", {}) or {}, path, report)
    _architecture(config.get("Architecture") or {}, path, report)
    for section, registry in (("Loss", LOSSES), ("PostProcess", POSTPROCESSES), ("Metric", METRICS)):
        if isinstance(config.get(section), dict):
            _component(registry, config[section], section, path, report)
    if isinstance(config.get("Optimizer"), dict):
        _optimizer(config["Optimizer"], path, report)
    for section in ("Train", "Eval"):
        if isinstance(config.get(section), dict):
            _data(config[section], section, path, report)
    return Conversion(PADDLEOCR, path, config, report.unmapped, report.notes)


def _global(glob: Dict[str, Any], path: str, report: Report) -> None:
    for key in list(glob):
        if key in AMP_ONLY_GLOBAL and not glob.get("use_amp"):
            continue  # no effect without AMP, as in PaddleOCR: kept as written
        if key in UNSUPPORTED_GLOBAL and glob[key]:
            report.unmapped_key(f"Global.{key}", f"not supported ({UNSUPPORTED_GLOBAL[key]})", glob.pop(key))
        elif key not in GLOBAL_SCHEMA and key not in UNSUPPORTED_GLOBAL:
            report.unmapped_key(f"Global.{key}", "no ppdist equivalent", glob.pop(key))
    for key in GLOBAL_PATH_KEYS:
        value = glob.get(key)
        if value:
            glob[key] = fix_path(value, path, f"Global.{key}", report)
            if not os.path.isfile(glob[key]):
                report.note(
                    f"Global.{key}: {value} does not exist here (PaddleOCR resolves it from its checkout's "
                    f"root); give it with -o Global.{key}=PATH"
                )


def _component(
    registry: Any, entry: Dict[str, Any], where: str, path: str, report: Report, keep: tuple = ()
) -> None:
    name = entry.get("name")
    if name not in registry:
        raise ConfigError(
            f"{path}: {where}.name {name!r} is not supported by ppdist "
            f"(it has: {', '.join(registry.names())})"
        )
    accepted, var_kw = registry.accepted_keys(name)
    for key in list(entry):
        if key != "name" and key not in accepted and key not in keep and not var_kw:
            report.unmapped_key(f"{where}.{key}", f"ppdist's {name} has no such option", entry.pop(key))


def _architecture(arch: Dict[str, Any], path: str, report: Report, where: str = "Architecture") -> None:
    if arch.get("Transform"):
        raise ConfigError(
            f"{path}: {where}.Transform ({arch['Transform'].get('name')}) is not supported by "
            f"ppdist (no TPS/STN)"
        )
    if isinstance(arch.get("Models"), dict):  # DistillationModel: each model is an architecture
        for key in list(arch):
            if key not in DISTILLATION_KEYS:
                report.unmapped_key(f"{where}.{key}", "no ppdist equivalent", arch.pop(key))
        for name, model in arch["Models"].items():
            if isinstance(model, dict):
                _architecture(model, path, report, f"{where}.Models.{name}")
        return
    own_keys = ARCHITECTURE_KEYS + (DISTILLATION_MODEL_KEYS if where != "Architecture" else ())
    for key in list(arch):
        if key not in own_keys:
            report.unmapped_key(f"{where}.{key}", "no ppdist equivalent", arch.pop(key))
    for key, registry in (("Backbone", BACKBONES), ("Neck", NECKS), ("Head", HEADS)):
        if isinstance(arch.get(key), dict):
            _component(
                registry,
                arch[key],
                f"{where}.{key}",
                path,
                report,
                keep=(STAGE_PRETRAINED_KEY,) if key == "Backbone" else (),
            )


def _optimizer(opt: Dict[str, Any], path: str, report: Report) -> None:
    _component(OPTIMIZERS, opt, "Optimizer", path, report, keep=OPTIMIZER_COMMON_KEYS)
    lr = opt.get("lr")
    if isinstance(lr, dict):
        lr.setdefault("name", "Const")
        _component(LR_SCHEDULERS, lr, "Optimizer.lr", path, report)


def _data(part: Dict[str, Any], section: str, path: str, report: Report) -> None:
    for key in list(part):
        if key not in ("dataset", "loader"):
            report.unmapped_key(f"{section}.{key}", "no ppdist equivalent", part.pop(key))
    dataset = part.get("dataset") or {}
    _component(DATASETS, dataset, f"{section}.dataset", path, report, keep=("transforms", "batch_transforms"))
    for ops_key in ("transforms", "batch_transforms"):
        kept: List[Any] = []
        for i, op in enumerate(dataset.get(ops_key) or []):
            name = next(iter(op)) if isinstance(op, dict) and len(op) == 1 else None
            if name not in TRANSFORMS:
                report.unmapped_key(
                    f"{section}.dataset.{ops_key}[{i}]", "ppdist has no such transform; dropped", op
                )
                continue
            params = dict(op[name] or {})
            _component(
                TRANSFORMS, dict(params, name=name), f"{section}.dataset.{ops_key}[{i}].{name}", path, report
            )
            accepted, var_kw = TRANSFORMS.accepted_keys(name)
            kept.append({name: {k: v for k, v in params.items() if var_kw or k in accepted} or None})
        if ops_key in dataset:
            dataset[ops_key] = kept
    loader = part.get("loader") or {}
    for key in list(loader):
        if key not in LOADER_SCHEMA:
            report.unmapped_key(f"{section}.loader.{key}", "no ppdist equivalent", loader.pop(key))
