"""Losses; importing this package registers them in ``LOSSES``."""

from ppdist.losses.assigners import ATSSAssigner, TaskAlignedAssigner
from ppdist.losses.ctc import CTCLoss
from ppdist.losses.ppyoloe import PPYOLOELoss
from ppdist.losses.seg import CrossEntropyLoss, MultiOutputLoss, OhemCrossEntropyLoss

__all__ = [
    "ATSSAssigner",
    "CTCLoss",
    "CrossEntropyLoss",
    "MultiOutputLoss",
    "OhemCrossEntropyLoss",
    "PPYOLOELoss",
    "TaskAlignedAssigner",
]
