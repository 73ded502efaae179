"""Build one component from its config entry: the one path every builder takes.

A component entry is ``{name: X, **kwargs}``. ``build_component`` strips the name, adds the shared
Global values the constructor ``X`` accepts (``Global.character_dict_path``, ``num_classes``, ...;
Global wins, as in PaddleOCR) and builds it through the registry, which checks every keyword
against the constructor's signature first. ``component_kwargs`` is the same without building
(for validation and for the files that describe an exported model).
"""

from __future__ import annotations

from typing import Any, Mapping

from ppdist.config.inject import component_kwargs
from ppdist.registry import Registry

__all__ = ["build_component", "component_kwargs"]


def build_component(
    registry: Registry, entry: Mapping[str, Any], config: Mapping[str, Any], where: str, **extra: Any
) -> Any:
    """The component ``entry`` of ``registry`` with ``config``'s shared Global values it accepts;
    ``extra`` keyword arguments are supplied by the framework (e.g. a dataset's transforms)."""
    kwargs = component_kwargs(registry, entry, config)
    return registry.build(dict(kwargs, name=entry["name"]), where=where, **extra)
