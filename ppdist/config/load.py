"""``load_config``: read a config file, apply ``-o`` overrides, validate; errors name the file."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from ppdist.config.validate import validate
from ppdist.config.yaml_io import apply_overrides, load_yaml_with_bases
from ppdist.errors import ConfigError


def load_config(path: str, overrides: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Load ``path`` with its ``_BASE_`` files, apply ``overrides`` and validate.

    Every ``ConfigError`` message starts with the config file it concerns. A PaddleDetection or
    PaddleSeg config is converted to ppdist's schema first (``ppdist.convert.configs.convert``).
    """
    from ppdist.convert.configs.convert import load_paddle_config

    try:
        config = load_paddle_config(path)
        if config is None:
            config = load_yaml_with_bases(path)
        apply_overrides(config, overrides or ())
        return validate(config)
    except ConfigError as exc:
        message = str(exc)
        if not message.startswith(path):
            message = f"{path}: {message}"
        raise ConfigError(message) from None
