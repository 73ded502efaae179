"""Losses; importing this package registers them in ``LOSSES``."""
from ppdist.losses.ctc import CTCLoss
from ppdist.losses.seg import CrossEntropyLoss, MultiOutputLoss, OhemCrossEntropyLoss

__all__ = ["CTCLoss", "CrossEntropyLoss", "MultiOutputLoss", "OhemCrossEntropyLoss"]
