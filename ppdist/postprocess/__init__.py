"""Post-processing; importing this package registers it in ``POSTPROCESSES``."""
from ppdist.postprocess.ctc_decode import CTCLabelDecode

__all__ = ["CTCLabelDecode"]
