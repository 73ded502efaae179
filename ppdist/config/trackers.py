"""Settings of the experiment trackers beside TensorBoard, checked before training starts.

``Global.mlflow`` (true, or ``{tracking_uri, experiment_name, run_name, tags}``) turns MLflow on;
``Global.use_wandb: true`` or PaddleOCR's top-level ``wandb`` section (the keywords of
``wandb.init``) turns Weights & Biases on. A tracker the config asks for whose package is missing
is a ``ConfigError`` naming the pip command, raised at validation, before any process starts.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Dict, Mapping, Optional, Tuple

from ppdist.errors import ConfigError
from ppdist.registry import did_you_mean

MLFLOW_KEYS = ("tracking_uri", "experiment_name", "run_name", "tags")
# the wandb.init keywords the wandb section may hold (PaddleOCR's save_dir is wandb's dir)
WANDB_KEYS = (
    "project",
    "entity",
    "name",
    "id",
    "group",
    "job_type",
    "tags",
    "notes",
    "mode",
    "resume",
    "dir",
    "save_dir",
)
WANDB_MODES = ("online", "offline", "disabled")
WANDB_RESUME = ("allow", "must", "never", "auto")
DEFAULT_EXPERIMENT = "ppdist"
EXTRA_HINT = 'or pip install -e ".[trackers]" in a ppdist checkout'


def package_missing(module: str) -> bool:
    """Whether ``module`` cannot be imported (found without importing it; a ``None`` entry in
    ``sys.modules`` counts as missing, as for ``import``)."""
    if module in sys.modules:
        return sys.modules[module] is None
    return importlib.util.find_spec(module) is None


def require_package(module: str, pip_name: str, key: str) -> None:
    if package_missing(module):
        raise ConfigError(
            f"{key} asks for {module}, which is not installed: pip install {pip_name} ({EXTRA_HINT}), "
            f"or turn {key} off"
        )


def _check_str(value: Any, path: str) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(
            f"wrong type for {path}: expected a string or null, got {type(value).__name__} ({value!r})"
        )


def _check_keys(spec: Mapping[str, Any], accepted: Tuple[str, ...], path: str) -> None:
    for key in spec:
        if key not in accepted:
            raise ConfigError(f"unknown key {path}.{key}.{did_you_mean(key, accepted)}")


def mlflow_settings(glob: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """``{tracking_uri, experiment_name, run_name, tags}`` of ``Global.mlflow`` (None when off);
    ``tracking_uri`` None means MLFLOW_TRACKING_URI, else a file store in save_model_dir."""
    spec = glob.get("mlflow")
    if not spec:
        return None
    spec = {} if spec is True else spec
    _check_keys(spec, MLFLOW_KEYS, "Global.mlflow")
    for key in ("tracking_uri", "experiment_name", "run_name"):
        _check_str(spec.get(key), f"Global.mlflow.{key}")
    tags = spec.get("tags") or {}
    if not isinstance(tags, dict):
        raise ConfigError(f"Global.mlflow.tags must be a mapping {{name: value}}, got {tags!r}")
    return {
        "tracking_uri": spec.get("tracking_uri"),
        "experiment_name": spec.get("experiment_name") or DEFAULT_EXPERIMENT,
        "run_name": spec.get("run_name"),
        "tags": {str(k): str(v) for k, v in tags.items()},
    }


def wandb_settings(config: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The ``wandb.init`` keywords of the top-level ``wandb`` section (None when W&B is off): on
    with ``Global.use_wandb: true``, or with a ``wandb`` section unless ``use_wandb`` is false
    (PaddleOCR's rule). ``save_dir`` is given as ``dir``."""
    use = config.get("Global", {}).get("use_wandb")
    section = config.get("wandb")
    if use is False or (use is None and section is None):
        return None
    section = section or {}
    if not isinstance(section, dict):
        raise ConfigError(f"the wandb section must be a mapping of wandb.init keywords, got {section!r}")
    _check_keys(section, WANDB_KEYS, "wandb")
    for key in WANDB_KEYS:
        if key not in ("tags", "resume"):
            _check_str(section.get(key), f"wandb.{key}")
    tags = section.get("tags")
    if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        raise ConfigError(f"wandb.tags must be a list of strings, got {tags!r}")
    mode = section.get("mode")
    if mode is not None and mode not in WANDB_MODES:
        raise ConfigError(f"wandb.mode must be one of {list(WANDB_MODES)}, got {mode!r}")
    resume = section.get("resume")
    if resume is not None and not isinstance(resume, bool) and resume not in WANDB_RESUME:
        raise ConfigError(f"wandb.resume must be true, false or one of {list(WANDB_RESUME)}, got {resume!r}")
    settings = {k: v for k, v in section.items() if v is not None and k != "save_dir"}
    if section.get("save_dir") and "dir" not in settings:
        settings["dir"] = section["save_dir"]
    return settings


def validate_trackers(config: Mapping[str, Any]) -> None:
    """Check the trackers' settings and that their packages are installed."""
    if mlflow_settings(config["Global"]) is not None:
        require_package("mlflow", "mlflow-skinny", "Global.mlflow")
    if wandb_settings(config) is not None:
        require_package("wandb", "wandb", "Global.use_wandb / the wandb section")
