"""Convert a PaddleDetection / PaddleSeg / PaddleOCR config file to a ppdist config.

``convert_config(path)`` detects the suite and returns a ``Conversion`` (the ppdist config, the
keys with no equivalent, the conversion notes); ``Conversion.to_yaml()`` is the file to write.
``load_paddle_config(path)`` is the hook of ``ppdist.config.load_config``: the converted config of
a PaddleDetection/PaddleSeg file, or None for a file already in ppdist's (PaddleOCR's) schema.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from typing import Any, Dict, Optional

from ppdist.convert.configs.common import PADDLEDET, PADDLEOCR, PADDLESEG, Conversion
from ppdist.convert.configs.detect import PPDIST, UNKNOWN, detect_suite, suite_of
from ppdist.errors import ConfigError
from ppdist.utils.atomic import write_text_atomic

CONVERTED_NAME = "converted_config.yml"


def convert_config(path: str, suite: Optional[str] = None) -> Conversion:
    """Convert ``path`` (its suite detected unless given); ``ConfigError`` with one line otherwise."""
    suite = suite or detect_suite(path)
    if suite == PADDLEDET:
        from ppdist.convert.configs.paddledetection import convert_det

        return convert_det(path)
    if suite == PADDLESEG:
        from ppdist.convert.configs.paddleseg import convert_seg

        return convert_seg(path)
    if suite in (PPDIST, PADDLEOCR):
        from ppdist.convert.configs.common import read_paddle_yaml
        from ppdist.convert.configs.paddleocr import convert_ocr

        read_paddle_yaml(path)  # a missing or unreadable file: its own one-line error
        return convert_ocr(path)
    from ppdist.convert.configs.common import read_paddle_yaml

    keys = sorted(read_paddle_yaml(path))
    raise ConfigError(
        f"{path}: cannot tell which suite this config comes from: its top-level keys {keys} are not "
        f"PaddleOCR/ppdist sections, PaddleDetection keys (architecture, TrainReader, ...) or "
        f"PaddleSeg keys (model, train_dataset, ...)"
    )


@functools.lru_cache(maxsize=8)
def _paddle_conversion(path: str, modified_ns: int) -> Optional[Conversion]:
    suite = detect_suite(path)
    return convert_config(path, suite) if suite in (PADDLEDET, PADDLESEG) else None


def conversion_of(path: str) -> Optional[Conversion]:
    """The ``Conversion`` of a PaddleDetection/PaddleSeg file, else None. Converted once per process
    (``load_config`` and the tools' reports ask for the same file); callers must not modify it."""
    try:
        modified_ns = os.stat(path).st_mtime_ns
    except OSError:
        return None  # ppdist's loader reports the missing file
    return _paddle_conversion(os.path.abspath(path), modified_ns)


def load_paddle_config(path: str) -> Optional[Dict[str, Any]]:
    """A copy of the ppdist config of a PaddleDetection/PaddleSeg file (converted), else None."""
    conversion = conversion_of(path)
    return copy.deepcopy(conversion.config) if conversion is not None else None


def report_conversion(
    conversion: Optional[Conversion], save_dir: Optional[str], logger: logging.Logger, is_main: bool = True
) -> Optional[str]:
    """Log the unmapped keys as warnings and (main process) save the converted YAML in ``save_dir``."""
    if conversion is None or not is_main:
        return None
    logger.warning("%s is a %s config: converted to ppdist's schema", conversion.source, conversion.suite)
    for item in conversion.unmapped:
        logger.warning("not converted: %s", item)
    if not save_dir:
        return None
    target = os.path.join(save_dir, CONVERTED_NAME)
    write_text_atomic(target, conversion.to_yaml())
    logger.info("converted config written to %s", target)
    return target


__all__ = [
    "CONVERTED_NAME",
    "Conversion",
    "convert_config",
    "conversion_of",
    "load_paddle_config",
    "report_conversion",
    "detect_suite",
    "suite_of",
    "UNKNOWN",
]
