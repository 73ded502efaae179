"""Necks; importing this package registers them in ``NECKS``."""

from ppdist.modeling.necks.csp_pan import CSPPAN
from ppdist.modeling.necks.custom_csp_pan import CustomCSPPAN
from ppdist.modeling.necks.fpn import FPN
from ppdist.modeling.necks.rnn import SequenceEncoder

__all__ = ["CSPPAN", "CustomCSPPAN", "FPN", "SequenceEncoder"]
