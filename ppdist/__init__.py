"""ppdist: PaddleOCR / PaddleDetection / PaddleSeg training on PyTorch with one distributed trainer.

The Python API. Importing any ``ppdist`` module runs this file first, which registers every
component (``ppdist.components``); no module of the package imports this one.
"""

from ppdist.components import build_loss, build_metric, build_model, build_postprocess
from ppdist.convert.configs import load_config

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "build_loss",
    "build_metric",
    "build_model",
    "build_postprocess",
    "load_config",
]
