"""Heads; importing this package registers them in ``HEADS``."""

from ppdist.modeling.heads.bbox_head import BBoxHead, TwoFCHead
from ppdist.modeling.heads.cascade_head import CascadeHead, CascadeTwoFCHead
from ppdist.modeling.heads.ctc import CTCHead
from ppdist.modeling.heads.faster_rcnn import FasterRCNNHead
from ppdist.modeling.heads.multi_head import MultiHead
from ppdist.modeling.heads.ocrnet import OCRHead
from ppdist.modeling.heads.pp_liteseg import PPLiteSegHead
from ppdist.modeling.heads.ppyoloe import PPYOLOEHead
from ppdist.modeling.heads.res5_head import Res5Head
from ppdist.modeling.heads.rpn_head import RPNHead
from ppdist.modeling.heads.sar import SARHead
from ppdist.modeling.heads.segformer import SegFormerHead
from ppdist.modeling.heads.slanet import SLAHead

__all__ = [
    "BBoxHead",
    "CascadeHead",
    "CascadeTwoFCHead",
    "CTCHead",
    "FasterRCNNHead",
    "MultiHead",
    "OCRHead",
    "PPLiteSegHead",
    "PPYOLOEHead",
    "Res5Head",
    "RPNHead",
    "SARHead",
    "SegFormerHead",
    "SLAHead",
    "TwoFCHead",
]
