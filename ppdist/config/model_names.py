"""The model names of a distillation config, and the check that every name another section uses
(a loss's ``model_name_pairs`` / ``model_name_list``, a post-process's ``model_name``,
``Metric.key``) is one of them: components call ``check_model_names`` from their
``check_config`` hook, so a misspelt or renamed model is a config error before any model is built,
not a KeyError at the first step or the first evaluation."""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple

from ppdist.errors import ConfigError
from ppdist.registry import did_you_mean


def architecture_models(config: Mapping[str, Any]) -> Optional[List[str]]:
    """The names of ``Architecture.Models`` (a DistillationModel's), None for a single model."""
    models = (config.get("Architecture") or {}).get("Models")
    return [str(name) for name in models] if isinstance(models, Mapping) else None


def check_model_names(
    used: Iterable[Tuple[str, Any]],
    config: Mapping[str, Any],
    known: Optional[Sequence[str]] = None,
    known_as: str = "a model of Architecture.Models",
) -> None:
    """Each ``(key path, name)`` of ``used`` names a model of ``known`` (default: the config's
    ``Architecture.Models``), else one ``ConfigError`` naming the key, the name and the closest
    model names. Nothing is checked without ``Architecture.Models`` (a single model)."""
    models = architecture_models(config) if known is None else list(known)
    if models is None:  # the parts of a distillation recipe on one model (tests, the Python API)
        return
    for where, name in used:
        if name not in models:
            raise ConfigError(f"{where}: {name!r} is not {known_as}.{did_you_mean(str(name), models)}")
