"""The shared ``Global`` values a component gets: ``SHARED_GLOBAL_KEYS`` given to every constructor
that takes them (Global wins, as in PaddleOCR). Used by validation and by ``ppdist.builder``."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from ppdist.config.schema import SHARED_GLOBAL_KEYS


def shared_global_values(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The Global values injected into components (see ``SHARED_GLOBAL_KEYS``)."""
    glob = config.get("Global") or {}
    return {k: glob[k] for k in SHARED_GLOBAL_KEYS if glob.get(k) is not None}


def inject_globals(
    registry: Any, name: str, kwargs: Dict[str, Any], shared: Mapping[str, Any]
) -> Dict[str, Any]:
    """``kwargs`` plus the shared Global values the constructor ``name`` accepts (Global wins)."""
    accepted, _ = registry.accepted_keys(name)
    out = dict(kwargs)
    out.update({k: v for k, v in shared.items() if k in accepted})
    return out


def component_kwargs(registry: Any, entry: Mapping[str, Any], config: Mapping[str, Any]) -> Dict[str, Any]:
    """The keyword arguments of the component ``entry`` (``{name, **kwargs}``): its own, without the
    name, plus the shared Global values of ``config`` that its constructor accepts (Global wins)."""
    kwargs = {k: v for k, v in entry.items() if k != "name"}
    return inject_globals(registry, entry["name"], kwargs, shared_global_values(config))
