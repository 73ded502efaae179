"""Name -> class registries and signature-checked construction.

Every buildable component (backbone, loss, transform, ...) registers itself in the
registry of its kind. A config entry ``{name: X, **kwargs}`` is built with
``REGISTRY.build(entry)``; the keyword arguments are checked against the constructor's
signature *before* anything is constructed, so a typo produces one clear message with
the closest valid names instead of a ``TypeError`` from deep inside a constructor.
"""

from __future__ import annotations

import difflib
import inspect
import typing
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ppdist.errors import ConfigError


def closest(word: str, candidates: Iterable[str], n: int = 3) -> List[str]:
    """The candidates most similar to ``word`` (difflib ratio), best first."""
    candidates = list(candidates)
    found = difflib.get_close_matches(word, candidates, n=n, cutoff=0.5)
    if not found:
        lowered = {c.lower(): c for c in candidates}
        found = [lowered[c] for c in difflib.get_close_matches(word.lower(), list(lowered), n=n, cutoff=0.5)]
    return found


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """A ' Did you mean ...?' suffix, or the list of valid names when nothing is close."""
    candidates = sorted(set(candidates))
    near = closest(word, candidates)
    if near:
        return " Did you mean: " + ", ".join(repr(c) for c in near) + "?"
    return " Valid names: " + ", ".join(candidates) + "." if candidates else ""


def _type_matches(value: Any, annotation: Any) -> bool:
    """True when ``value`` plausibly fits ``annotation`` (only simple types are checked)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    if isinstance(annotation, str):  # unresolved forward reference: do not guess
        return True
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        return any(_type_matches(value, a) for a in args)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple, Sequence, typing.Sequence) or annotation in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin in (dict, Mapping, typing.Mapping) or annotation is dict:
        return isinstance(value, dict)
    return True


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


class Registry:
    """A mapping from component names to classes (or factories) of one kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: Dict[str, Callable[..., Any]] = {}

    def register(self, obj: Optional[Callable[..., Any]] = None, *, name: Optional[str] = None):
        """Register ``obj`` under ``name`` (default: its ``__name__``); usable as a decorator."""

        def _add(target: Callable[..., Any]) -> Callable[..., Any]:
            key = name or target.__name__
            if key in self._items and self._items[key] is not target:
                raise KeyError(f"{self.kind} '{key}' is already registered")
            self._items[key] = target
            return target

        return _add(obj) if obj is not None else _add

    def names(self) -> List[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def get(self, name: str, where: str = "") -> Callable[..., Any]:
        """The class registered as ``name``; a ``ConfigError`` with suggestions otherwise."""
        if not isinstance(name, str) or name not in self._items:
            loc = f" at {where}" if where else ""
            raise ConfigError(
                f"unknown {self.kind} name {name!r}{loc}.{did_you_mean(str(name), self._items)}"
            )
        return self._items[name]

    def check(
        self, name: str, kwargs: Mapping[str, Any], where: str = "", injected: Sequence[str] = ()
    ) -> None:
        """Raise ``ConfigError`` unless ``name(**kwargs)`` matches the constructor signature.

        ``injected`` names arguments the framework supplies itself (not the user's to miss).
        """
        target = self.get(name, where)
        params = _signature_params(target)
        accepts_var_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
        named = {k: p for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        prefix = f"{where}." if where else ""
        for key, value in kwargs.items():
            if key not in named:
                if accepts_var_kw:
                    continue
                raise ConfigError(
                    f"unknown key {prefix}{key} for {self.kind} {name!r}."
                    f"{did_you_mean(key, named)}{self._owners_hint(key, name, where)}"
                )
            annotation = _resolved_hints(target).get(key, named[key].annotation)
            if not _type_matches(value, annotation):
                raise ConfigError(
                    f"wrong type for {prefix}{key}: expected {_type_name(annotation)}, "
                    f"got {type(value).__name__} ({value!r})"
                )
        missing = [
            k for k, p in named.items() if p.default is p.empty and k not in kwargs and k not in injected
        ]
        if missing:
            raise ConfigError(
                f"missing required key(s) for {self.kind} {name!r} at {where or 'config'}: "
                + ", ".join(missing)
            )

    def _owners_hint(self, key: str, name: str, where: str) -> str:
        """' It is a key of: X, Y (set <where>.name)' when other components accept ``key``."""
        owners = [other for other in self._items if other != name and key in self.accepted_keys(other)[0]]
        if not owners:
            return ""
        return f" It is a key of: {', '.join(sorted(owners))} (set {where or self.kind}.name)."

    def build(self, cfg: Mapping[str, Any], where: str = "", **extra: Any) -> Any:
        """Build from ``{name: X, **kwargs}``; ``extra`` kwargs are supplied by the framework."""
        if not isinstance(cfg, Mapping) or "name" not in cfg:
            raise ConfigError(f"{where or self.kind} needs a mapping with a 'name' key, got {cfg!r}")
        kwargs = {k: v for k, v in cfg.items() if k != "name"}
        kwargs.update(extra)
        self.check(cfg["name"], kwargs, where)
        try:
            return self._items[cfg["name"]](**kwargs)
        except (ValueError, TypeError) as exc:  # a constructor rejecting a config value
            raise ConfigError(f"{where or self.kind} ({cfg['name']}): {exc}") from exc

    def accepted_keys(self, name: str) -> Tuple[List[str], bool]:
        """Keyword names the constructor takes, and whether it also takes ``**kwargs``."""
        params = _signature_params(self.get(name))
        keys = [k for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return keys, any(p.kind == p.VAR_KEYWORD for p in params.values())

    def value_of(self, entry: Mapping[str, Any], key: str) -> Any:
        """The value the component of ``entry`` (``{name, **kwargs}``) gets for ``key``: the entry's,
        else its constructor's default (None when it has neither)."""
        if key in entry:
            return entry[key]
        param = _signature_params(self.get(entry["name"])).get(key)
        return None if param is None or param.default is param.empty else param.default


def _signature_params(target: Callable[..., Any]) -> Dict[str, inspect.Parameter]:
    sig = inspect.signature(target.__init__ if inspect.isclass(target) else target)
    params = dict(sig.parameters)
    params.pop("self", None)
    return params


def _resolved_hints(target: Callable[..., Any]) -> Dict[str, Any]:
    func = target.__init__ if inspect.isclass(target) else target
    try:
        return typing.get_type_hints(func)
    except Exception:  # unresolvable annotations: fall back to raw ones
        return {}


ARCHITECTURES = Registry("architecture")  # Architecture.name: BaseModel (default), DistillationModel
BACKBONES = Registry("backbone")
NECKS = Registry("neck")
HEADS = Registry("head")
LOSSES = Registry("loss")
POSTPROCESSES = Registry("post-process")
METRICS = Registry("metric")
DATASETS = Registry("dataset")
TRANSFORMS = Registry("transform")
OPTIMIZERS = Registry("optimizer")
LR_SCHEDULERS = Registry("lr schedule")
REGULARIZERS = Registry("regularizer")
SYNTHETIC_DATA = Registry("synthetic data kind")  # Global.synthetic_data.kind -> data set generator
HOOKS = Registry("hook")
