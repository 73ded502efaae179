"""Read a YAML config with its ``_BASE_`` files, apply ``-o`` overrides, write the resolved config.

The YAML dialect is PyYAML's safe one, plus ``1e-5`` (no dot) read as a float. ``_BASE_`` files
merge underneath the file naming them: dicts merge recursively, lists and scalars are replaced,
the child wins.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

import yaml

from ppdist.config.schema import BASE_KEY, SECTIONS
from ppdist.errors import ConfigError
from ppdist.registry import did_you_mean
from ppdist.utils.atomic import write_text_atomic


class YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-5`` (no dot) as a float, unlike YAML 1.1."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_value(text: str) -> Any:
    """Parse an override value as YAML (``[0, 500]`` -> list, ``1e-5`` -> float, ``a`` -> str);
    ``ValueError`` when it is not YAML (``[out``), never a silent string."""
    try:
        return yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(
            f"the value {text!r} is not valid YAML ({problem}); quote a string: '\"{text}\"'"
        ) from None


def read_yaml_mapping(path: str, loader: type = YamlLoader) -> Dict[str, Any]:
    """The top-level mapping of one YAML file (no inheritance); ``ConfigError`` naming the file otherwise."""
    if os.path.isdir(path):
        raise ConfigError(f"{path} is a directory; give a config file (.yml)")
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = yaml.load(handle, Loader=loader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file (not UTF-8); give a YAML config file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def merge_dicts(base: Mapping[str, Any], child: Mapping[str, Any]) -> Dict[str, Any]:
    """Recursive merge: dicts merge, lists and scalars are replaced, the child wins."""
    out = copy.deepcopy(dict(base))
    for key, value in child.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_dicts(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_yaml_with_bases(path: str, _seen: Optional[Tuple[str, ...]] = None) -> Dict[str, Any]:
    """Read ``path`` and merge its ``_BASE_`` files (relative to it) underneath it."""
    real = os.path.realpath(path)
    seen = _seen or ()
    if real in seen:
        raise ConfigError(f"{path}: circular _BASE_ inheritance: " + " -> ".join(seen + (real,)))
    data = read_yaml_mapping(path)
    bases = data.pop(BASE_KEY, None) or []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list):
        raise ConfigError(f"{path}: {BASE_KEY} must be a list of file paths")
    merged: Dict[str, Any] = {}
    for base in bases:
        base_path = base if os.path.isabs(base) else os.path.join(os.path.dirname(path), base)
        if not os.path.isfile(base_path):
            raise ConfigError(f"{path}: {BASE_KEY} file not found: {base} (resolved to {base_path})")
        merged = merge_dicts(merged, load_yaml_with_bases(base_path, seen + (real,)))
    return merge_dicts(merged, data)


def apply_overrides(config: Dict[str, Any], overrides: Iterable[str], source: str = "-o") -> Dict[str, Any]:
    """Apply ``Section.key.sub=value`` overrides in place (values parsed as YAML).

    Integer path parts index into lists (``Train.dataset.transforms.2.RecResizeImg...``).
    """
    for item in overrides or ():
        if "=" not in item:
            raise ConfigError(f"{source} {item!r}: expected Key.sub=value")
        key, text = item.split("=", 1)
        try:
            value = parse_value(text)
        except ValueError as exc:
            raise ConfigError(f"{source} {item!r}: {exc}") from None
        parts = key.strip().split(".")
        if parts[0] not in SECTIONS:
            raise ConfigError(
                f"{source} {item!r}: unknown section {parts[0]!r}.{did_you_mean(parts[0], SECTIONS)}"
            )
        if len(parts) == 1:
            if not isinstance(value, dict):
                raise ConfigError(f"{source} {item!r}: a whole section needs a mapping value")
            config[parts[0]] = merge_dicts(config.get(parts[0]) or {}, value)
            continue
        node: Any = config.setdefault(parts[0], {})
        for depth, part in enumerate(parts[1:-1], start=1):
            node = _step_into(node, part, ".".join(parts[: depth + 1]), item, source)
        last = parts[-1]
        if isinstance(node, list):
            node[_list_index(node, last, key, item, source)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError(f"{source} {item!r}: {'.'.join(parts[:-1])} is not a mapping")
    return config


def _list_index(node: list, part: str, path: str, item: str, source: str) -> int:
    if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
        raise ConfigError(f"{source} {item!r}: {path} needs a list index in [0, {len(node)})")
    return int(part)


def _step_into(node: Any, part: str, path: str, item: str, source: str) -> Any:
    if isinstance(node, list):
        return node[_list_index(node, part, path, item, source)]
    if not isinstance(node, dict):
        raise ConfigError(f"{source} {item!r}: {path} is not a mapping")
    if node.get(part) is None:
        node[part] = {}
    return node[part]


def dump_config(config: Mapping[str, Any], path: str) -> None:
    """Write the resolved config as YAML (atomically)."""
    write_text_atomic(path, yaml.safe_dump(dict(config), sort_keys=False, allow_unicode=True))
