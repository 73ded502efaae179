"""Shared pieces of the Paddle config converters: YAML reading, the conversion result, key tracking.

Every converter reads the Paddle mapping through ``Keys`` so that a key it never reads is
listed ("key path: why") instead of being dropped silently.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import yaml

from ppdist.config import GLOBAL_SCHEMA, SECTIONS, YamlLoader, read_yaml_mapping
from ppdist.errors import ConfigError

PADDLEDET = "PaddleDetection"
PADDLESEG = "PaddleSeg"
PADDLEOCR = "PaddleOCR"


class _PaddleLoader(YamlLoader):
    """ppdist's loader (``1e-5`` is a float) that also reads Paddle's ``!ClassName`` tags as ``{name: ClassName}``."""


def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Dict[str, Any]:
    """``!CosineDecay {max_epochs: 96}`` (PaddleDetection's serializable classes) -> a named mapping."""
    if isinstance(node, yaml.MappingNode):
        return dict(loader.construct_mapping(node, deep=True), name=suffix)
    if isinstance(node, yaml.SequenceNode):
        return {"name": suffix, "args": loader.construct_sequence(node, deep=True)}
    value = loader.construct_scalar(node)
    return {"name": suffix} if value in ("", None) else {"name": suffix, "args": [value]}


_PaddleLoader.add_multi_constructor("!", _tagged)


def read_paddle_yaml(path: str) -> Dict[str, Any]:
    """The top-level mapping of one Paddle YAML file (no inheritance); ``ConfigError`` otherwise."""
    return read_yaml_mapping(path, _PaddleLoader)


def base_paths(path: str, bases: Any, key: str) -> List[str]:
    """The base files named by ``key`` (a string or a list), resolved relative to ``path``."""
    if bases is None:
        return []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{path}: {key} must be a file path or a list of file paths, got {bases!r}")
    out = []
    for base in bases:
        resolved = os.path.expanduser(base)
        if not os.path.isabs(resolved):
            resolved = os.path.join(os.path.dirname(path), resolved)
        if not os.path.isfile(resolved):
            raise ConfigError(
                f"{path}: {key} file not found: {base} (resolved to {os.path.normpath(resolved)})"
            )
        out.append(resolved)
    return out


def check_cycle(path: str, seen: Sequence[str], key: str) -> str:
    real = os.path.realpath(path)
    if real in seen:
        raise ConfigError(f"{path}: circular {key} inheritance: " + " -> ".join(list(seen) + [real]))
    return real


# --------------------------------------------------------------------------- the result
@dataclass
class Conversion:
    """A converted config: the ppdist ``config`` plus what had no equivalent and what was decided."""

    suite: str
    source: str
    config: Dict[str, Any]
    unmapped: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def header(self) -> str:
        lines = [
            f"Converted from the {self.suite} config {self.source} by tools/convert_paddle_config.py.",
            "Review the keys listed below before training.",
        ]
        if self.unmapped:
            lines.append("Keys with no ppdist equivalent (not converted):")
            lines += [f"  - {item}" for item in self.unmapped]
        else:
            lines.append("Every key has a ppdist equivalent.")
        if self.notes:
            lines.append("Conversion notes:")
            lines += [f"  - {item}" for item in self.notes]
        return "".join(f"# {line}\n" for line in lines)

    def to_yaml(self) -> str:
        """The ppdist config as YAML, headed by the lists above as comments."""
        ordered = {k: _flow_leaves(self.config[k], k) for k in SECTIONS if k in self.config}
        if isinstance(ordered.get("Global"), dict):
            order = {k: i for i, k in enumerate(GLOBAL_SCHEMA)}
            ordered["Global"] = dict(
                sorted(ordered["Global"].items(), key=lambda kv: order.get(kv[0], len(order)))
            )
        body = yaml.dump(ordered, Dumper=_FlowListDumper, sort_keys=False, allow_unicode=True, width=110)
        return self.header() + "\n" + body


class _FlowListDumper(yaml.SafeDumper):
    """Writes lists of scalars inline (``[3, 6, 6, 3]``), everything else in block style."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


class _Flow(dict):
    """A small mapping written inline (``{name: L2, factor: 0.0005}``)."""


def _is_leaf(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_leaf(v) and not isinstance(v, (list, tuple)) for v in value)
    return value is None or isinstance(value, (int, float, str, bool))


def _flow_leaves(node: Any, key: str = "") -> Any:
    """Mark the small all-scalar mappings inside lists (transform options, loss entries) and a few
    known small option mappings for inline output, as ppdist's own configs are written."""
    if isinstance(node, dict):
        out = {k: _flow_leaves(v, k) for k, v in node.items()}
        small = key in ("regularizer", "loss_weight", "static_assigner", "assigner", "Backbone") or not key
        if small and node and all(_is_leaf(v) for v in node.values()) and len(repr(node)) < 100:
            return _Flow(out)
        return out
    if isinstance(node, list):
        return [_flow_op(v) if _is_op(v) else _flow_leaves(v) for v in node]
    return node


def _is_op(node: Any) -> bool:
    return isinstance(node, dict) and len(node) == 1 and isinstance(next(iter(node.values())), dict)


def _flow_op(node: Dict[str, Any]) -> Dict[str, Any]:
    """``{Op: {options}}`` with the options inline when they are short."""
    ((name, params),) = node.items()
    if all(_is_leaf(v) for v in params.values()) and len(repr(params)) < 100:
        return {name: _Flow(params)}
    return {name: _flow_leaves(params, name)}


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(isinstance(v, (int, float, str, bool)) or v is None for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_FlowListDumper.add_representer(list, _represent_list)
_FlowListDumper.add_representer(
    _Flow, lambda dumper, data: dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)
)
_FlowListDumper.add_representer(tuple, _represent_list)


# --------------------------------------------------------------------------- key tracking
def _short(value: Any) -> str:
    """``repr`` of a listed value; strings (paths, URLs) in full, anything else cut at 70 characters."""
    text = repr(value)
    return text if len(text) <= 70 or isinstance(value, str) else text[:67] + "..."


class Report:
    """The two lists a conversion produces."""

    def __init__(self) -> None:
        self.unmapped: List[str] = []
        self.notes: List[str] = []

    def unmapped_key(self, path: str, why: str, value: Any = None, show_value: bool = True) -> None:
        shown = f" (= {_short(value)})" if show_value and value is not None else ""
        self.unmapped.append(f"{path}{shown}: {why}")

    def note(self, text: str) -> None:
        self.notes.append(text)


class Keys:
    """A Paddle mapping read key by key; ``finish`` lists every key that was never read."""

    def __init__(self, data: Any, path: str, report: Report) -> None:
        if data is not None and not isinstance(data, Mapping):
            raise ConfigError(f"{path or 'the config'} must be a mapping, got {_short(data)}")
        self.data: Dict[str, Any] = dict(data or {})
        self.path = path
        self.report = report
        self.used: set = set()

    def key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else str(key)

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        value = self.data.get(key, default)
        return default if value is None and default is not None else value

    def sub(self, key: str) -> "Keys":
        return Keys(self.get(key), self.key_path(key), self.report)

    def expect(self, key: str, default: Any, why: str) -> Any:
        """Read ``key``; a value other than ``default`` (the only one ppdist has) is listed."""
        value = self.get(key, default)
        if key in self.data and not same_value(value, default):
            self.report.unmapped_key(self.key_path(key), why, value)
        return value

    def skip(self, key: str, why: str) -> None:
        """List ``key`` (when present) as having no equivalent."""
        if key in self.data:
            self.report.unmapped_key(self.key_path(key), why, self.get(key))

    def finish(self, why: str = "no ppdist equivalent") -> None:
        for key in self.data:
            if key not in self.used:
                self.report.unmapped_key(self.key_path(key), why, self.data[key])
                self.used.add(key)


def same_value(a: Any, b: Any) -> bool:
    """Equality that treats lists and tuples alike and 1 == 1.0."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def ppdist_defaults(registry: Any, name: str) -> Dict[str, Any]:
    """Default values of the ppdist component ``name``'s constructor."""
    target = registry.get(name)
    sig = inspect.signature(target.__init__ if inspect.isclass(target) else target)
    return {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}


def component(registry: Any, name: str, values: Mapping[str, Any], explicit: Iterable[str]) -> Dict[str, Any]:
    """``{name, **kwargs}`` with the keys the Paddle config set (in ``explicit``'s order), plus the
    Paddle defaults that differ from ppdist's defaults (so the ppdist component behaves as the
    Paddle one)."""
    defaults = ppdist_defaults(registry, name)
    explicit = [k for k in explicit if k in values]
    out: Dict[str, Any] = {"name": name}
    out.update((k, _plain(values[k])) for k in explicit)
    for key, value in values.items():
        if key not in out and (key not in defaults or not same_value(value, defaults[key])):
            out[key] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------- paths
def is_url(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(("http://", "https://", "ftp://"))


def suite_root(config_path: str) -> Optional[str]:
    """The checkout a Paddle config lives in: the parent of its nearest ``configs`` folder."""
    folder = os.path.dirname(os.path.abspath(config_path))
    while True:
        if os.path.basename(folder) == "configs":
            return os.path.dirname(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def fix_path(value: Any, config_path: str, key_path: str, report: Report) -> Any:
    """A relative path that does not exist here but does inside the Paddle checkout the config
    comes from (Paddle tools run from the checkout's root) is rewritten to that location."""
    if (
        not isinstance(value, str)
        or not value
        or is_url(value)
        or os.path.isabs(value)
        or os.path.exists(value)
    ):
        return value
    root = suite_root(config_path)
    if root is not None and os.path.exists(os.path.join(root, value)):
        fixed = os.path.normpath(os.path.join(root, value))
        report.note(f"{key_path}: {value} is relative to the Paddle checkout; rewritten to {fixed}")
        return fixed
    return value
