"""Convert a PaddleDetection / PaddleSeg / PaddleOCR config file to a ppdist config.

``convert_config(path)`` detects the suite and returns a ``Conversion`` (the ppdist config, the
keys with no equivalent, the conversion notes); ``Conversion.to_yaml()`` is the file to write.
``load_config(path, overrides)`` is the suite-aware loader the tools and the Python API use:
``ppdist.config.load_config`` reading a PaddleDetection/PaddleSeg file through its conversion
(``load_paddle_config``) and any other file as ppdist's (PaddleOCR's) YAML with ``_BASE_``.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from typing import Any, Dict, Optional, Sequence

from ppdist.config import load_config as load_ppdist_config
from ppdist.config import load_yaml_with_bases
from ppdist.convert.configs.common import PADDLEDET, PADDLEOCR, PADDLESEG, Conversion, read_paddle_yaml
from ppdist.convert.configs.detect import PPDIST, UNKNOWN, detect_suite, suite_of
from ppdist.convert.configs.paddledetection import convert_det, convert_det_mapping, load_det_yaml
from ppdist.convert.configs.paddleocr import convert_ocr
from ppdist.convert.configs.paddleseg import convert_seg, convert_seg_mapping, load_seg_yaml
from ppdist.errors import ConfigError
from ppdist.utils.atomic import write_text_atomic

CONVERTED_NAME = "converted_config.yml"


def convert_config(path: str, suite: Optional[str] = None) -> Conversion:
    """Convert ``path`` (its suite detected unless given); ``ConfigError`` with one line otherwise."""
    suite = suite or detect_suite(path)
    if suite == PADDLEDET:
        return convert_det(path)
    if suite == PADDLESEG:
        return convert_seg(path)
    if suite in (PPDIST, PADDLEOCR):
        read_paddle_yaml(path)  # a missing or unreadable file: its own one-line error
        return convert_ocr(path)
    keys = sorted(read_paddle_yaml(path))
    raise ConfigError(
        f"{path}: cannot tell which suite this config comes from: its top-level keys {keys} are not "
        f"PaddleOCR/ppdist sections, PaddleDetection keys (architecture, TrainReader, ...) or "
        f"PaddleSeg keys (model, train_dataset, ...)"
    )


def read_paddle_mapping(path: str, suite: str) -> Dict[str, Any]:
    """The PaddleDetection (``suite`` PADDLEDET) or PaddleSeg (PADDLESEG) config ``path`` merged with
    its bases by that suite's rules, in the suite's own keys (not converted)."""
    if suite == PADDLEDET:
        return load_det_yaml(path)
    if suite == PADDLESEG:
        return load_seg_yaml(path)
    raise ValueError(f"not a PaddleDetection or PaddleSeg suite: {suite!r}")


def convert_mapping(data: Dict[str, Any], path: str, suite: str) -> Conversion:
    """Convert ``data``: the ``suite`` config ``path`` as ``read_paddle_mapping`` gives it, possibly changed
    (command-line overrides in the suite's keys, applied before the conversion as the suite would)."""
    if suite == PADDLEDET:
        return convert_det_mapping(data, path)
    if suite == PADDLESEG:
        return convert_seg_mapping(data, path)
    raise ValueError(f"not a PaddleDetection or PaddleSeg suite: {suite!r}")


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


def read_any_suite(path: str) -> Dict[str, Any]:
    """The ppdist-schema mapping of ``path`` before overrides and validation: a PaddleDetection or
    PaddleSeg config converted, any other file read as ppdist/PaddleOCR YAML with its ``_BASE_`` files."""
    config = load_paddle_config(path)
    return config if config is not None else load_yaml_with_bases(path)


def load_config(path: str, overrides: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """``ppdist.config.load_config`` of any suite's config: a PaddleDetection or PaddleSeg file is
    converted to ppdist's schema first; ``overrides`` use ppdist's key paths."""
    return load_ppdist_config(path, overrides, read=read_any_suite)


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
    "convert_mapping",
    "conversion_of",
    "load_config",
    "load_paddle_config",
    "read_any_suite",
    "read_paddle_mapping",
    "report_conversion",
    "detect_suite",
    "suite_of",
    "UNKNOWN",
]
