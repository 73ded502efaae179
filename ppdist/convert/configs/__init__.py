"""PaddleDetection / PaddleSeg / PaddleOCR configs converted to ppdist's schema.

``detect`` tells the suite of a file, ``paddledetection`` / ``paddleseg`` / ``paddleocr`` convert
one suite each (``transforms``: their data pipelines; ``common``: the pieces they share), and
``convert`` is the entry: ``convert_config``, the suite-aware ``load_config`` and the tools' report.
"""

from ppdist.convert.configs.common import Conversion
from ppdist.convert.configs.convert import (
    CONVERTED_NAME,
    conversion_of,
    convert_config,
    convert_mapping,
    load_config,
    load_paddle_config,
    read_any_suite,
    read_paddle_mapping,
    report_conversion,
)
from ppdist.convert.configs.detect import PADDLEDET, PADDLEOCR, PADDLESEG, PPDIST, UNKNOWN, detect_suite

__all__ = [
    "CONVERTED_NAME",
    "PADDLEDET",
    "PADDLEOCR",
    "PADDLESEG",
    "PPDIST",
    "UNKNOWN",
    "Conversion",
    "conversion_of",
    "convert_config",
    "convert_mapping",
    "detect_suite",
    "load_config",
    "load_paddle_config",
    "read_any_suite",
    "read_paddle_mapping",
    "report_conversion",
]
