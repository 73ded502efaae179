"""Losses; importing this package registers them in ``LOSSES``."""
from ppdist.losses.ctc import CTCLoss

__all__ = ["CTCLoss"]
