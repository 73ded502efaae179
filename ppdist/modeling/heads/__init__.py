"""Heads; importing this package registers them in ``HEADS``."""
from ppdist.modeling.heads.ctc import CTCHead

__all__ = ["CTCHead"]
