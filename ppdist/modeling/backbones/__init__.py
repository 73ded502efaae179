"""Backbones; importing this package registers them in ``BACKBONES``."""
from ppdist.modeling.backbones.mobilenet_v3 import MobileNetV3

__all__ = ["MobileNetV3"]
