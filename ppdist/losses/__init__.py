"""Losses; importing this package registers them in ``LOSSES``."""

from ppdist.losses.assigners import ATSSAssigner, TaskAlignedAssigner
from ppdist.losses.basic import DistanceLoss, DMLLoss
from ppdist.losses.cascade_rcnn import CascadeRCNNLoss
from ppdist.losses.combined import CombinedLoss
from ppdist.losses.ctc import CTCLoss
from ppdist.losses.distillation import (
    DistillationCTCLoss,
    DistillationDistanceLoss,
    DistillationDMLLoss,
    DistillationSARLoss,
)
from ppdist.losses.faster_rcnn import FasterRCNNLoss
from ppdist.losses.multi import MultiLoss
from ppdist.losses.ppyoloe import PPYOLOELoss
from ppdist.losses.rcnn_assigner import BBoxAssigner
from ppdist.losses.sar import SARLoss
from ppdist.losses.seg import CrossEntropyLoss, MultiOutputLoss, OhemCrossEntropyLoss
from ppdist.losses.table import SLALoss

__all__ = [
    "ATSSAssigner",
    "BBoxAssigner",
    "CascadeRCNNLoss",
    "CTCLoss",
    "CombinedLoss",
    "CrossEntropyLoss",
    "DMLLoss",
    "DistanceLoss",
    "DistillationCTCLoss",
    "DistillationDMLLoss",
    "DistillationDistanceLoss",
    "DistillationSARLoss",
    "FasterRCNNLoss",
    "MultiLoss",
    "MultiOutputLoss",
    "OhemCrossEntropyLoss",
    "PPYOLOELoss",
    "SARLoss",
    "SLALoss",
    "TaskAlignedAssigner",
]
