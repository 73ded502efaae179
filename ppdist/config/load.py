"""``load_config``: read a config file, apply ``-o`` overrides, validate; errors name the file."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence

from ppdist.config.validate import validate
from ppdist.config.yaml_io import apply_overrides, load_yaml_with_bases
from ppdist.errors import ConfigError

Reader = Callable[[str], Dict[str, Any]]  # config file -> its (unvalidated) mapping in ppdist's schema


def load_config(
    path: str, overrides: Optional[Sequence[str]] = None, read: Reader = load_yaml_with_bases
) -> Dict[str, Any]:
    """Read ``path`` with ``read`` (default: ppdist's YAML with its ``_BASE_`` files), apply
    ``overrides`` and validate.

    Every ``ConfigError`` message starts with the config file it concerns. Paddle suites' configs
    are read through ``ppdist.convert.configs.load_config``, which passes its own reader.
    """
    try:
        config = read(path)
        apply_overrides(config, overrides or ())
        return validate(config)
    except ConfigError as exc:
        message = str(exc)
        if not message.startswith(path):
            message = f"{path}: {message}"
        raise ConfigError(message) from None
