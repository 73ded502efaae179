"""Necks; importing this package registers them in ``NECKS``."""
from ppdist.modeling.necks.rnn import SequenceEncoder

__all__ = ["SequenceEncoder"]
