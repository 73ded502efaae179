"""The config: YAML in PaddleOCR's schema, read, merged, overridden and validated.

The resolved config is a plain ``dict`` with the sections Global, Architecture, Loss, Optimizer,
PostProcess, Metric, Train and Eval. ``yaml_io`` reads files (``_BASE_``), applies ``-o``
overrides and writes the resolved config; ``schema`` holds the known keys; ``validate`` checks a
config before any process group or data is touched; ``load`` puts the three together and names
the file in every error; ``inject`` (the shared Global values components get) serves validation
and ``ppdist.builder``, which is where callers find it. This package imports nothing from
``ppdist.convert``, ``ppdist.engine``, ``ppdist.data`` or ``ppdist.components``.
"""

from ppdist.config.load import load_config
from ppdist.config.profiler_options import ProfilerOptions, parse_profiler_options, profiler_settings
from ppdist.config.schema import (
    AMP_ONLY_GLOBAL,
    ARCHITECTURE_KEYS,
    BASE_KEY,
    COMPILE_KEYS,
    DISTILLATION_KEYS,
    DISTILLATION_MODEL_KEYS,
    GLOBAL_SCHEMA,
    LOADER_SCHEMA,
    OPTIMIZER_COMMON_KEYS,
    SECTIONS,
    SHARED_GLOBAL_KEYS,
    STAGE_PRETRAINED_KEY,
    UNSUPPORTED_GLOBAL,
    GlobalKey,
)
from ppdist.config.trackers import mlflow_settings, wandb_settings
from ppdist.config.validate import validate
from ppdist.config.validate_global import (
    auto_scale_lr_base,
    compile_options,
    early_stop_settings,
    synthetic_generator,
    validate_synthetic_spec,
)
from ppdist.config.yaml_io import (
    YamlLoader,
    apply_overrides,
    dump_config,
    load_yaml_with_bases,
    merge_dicts,
    parse_value,
    read_yaml_mapping,
)

__all__ = [
    "ARCHITECTURE_KEYS",
    "AMP_ONLY_GLOBAL",
    "BASE_KEY",
    "COMPILE_KEYS",
    "DISTILLATION_KEYS",
    "DISTILLATION_MODEL_KEYS",
    "GLOBAL_SCHEMA",
    "LOADER_SCHEMA",
    "OPTIMIZER_COMMON_KEYS",
    "SECTIONS",
    "SHARED_GLOBAL_KEYS",
    "STAGE_PRETRAINED_KEY",
    "UNSUPPORTED_GLOBAL",
    "GlobalKey",
    "ProfilerOptions",
    "YamlLoader",
    "apply_overrides",
    "auto_scale_lr_base",
    "compile_options",
    "dump_config",
    "early_stop_settings",
    "load_config",
    "load_yaml_with_bases",
    "merge_dicts",
    "mlflow_settings",
    "parse_profiler_options",
    "parse_value",
    "profiler_settings",
    "read_yaml_mapping",
    "synthetic_generator",
    "validate",
    "validate_synthetic_spec",
    "wandb_settings",
]
