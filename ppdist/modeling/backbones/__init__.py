"""Backbones; importing this package registers them in ``BACKBONES``."""

from ppdist.modeling.backbones.cspresnet import CSPResNet
from ppdist.modeling.backbones.hrnet import HRNet_W18, HRNet_W48
from ppdist.modeling.backbones.mix_transformer import (
    MixVisionTransformer_B0,
    MixVisionTransformer_B1,
    MixVisionTransformer_B2,
    MixVisionTransformer_B3,
    MixVisionTransformer_B4,
    MixVisionTransformer_B5,
)
from ppdist.modeling.backbones.mobilenet_v1_enhance import MobileNetV1Enhance
from ppdist.modeling.backbones.mobilenet_v3 import MobileNetV3
from ppdist.modeling.backbones.pp_lcnet import PPLCNet
from ppdist.modeling.backbones.resnet import ResNet
from ppdist.modeling.backbones.stdcnet import STDC1, STDC2

__all__ = [
    "CSPResNet",
    "HRNet_W18",
    "HRNet_W48",
    "MixVisionTransformer_B0",
    "MixVisionTransformer_B1",
    "MixVisionTransformer_B2",
    "MixVisionTransformer_B3",
    "MixVisionTransformer_B4",
    "MixVisionTransformer_B5",
    "MobileNetV1Enhance",
    "MobileNetV3",
    "PPLCNet",
    "ResNet",
    "STDC1",
    "STDC2",
]
