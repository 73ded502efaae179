"""Post-processing; importing this package registers it in ``POSTPROCESSES``."""

from ppdist.postprocess.ctc_decode import CTCLabelDecode
from ppdist.postprocess.nms import MultiClassNMS
from ppdist.postprocess.seg import SegPostProcess

__all__ = ["MultiClassNMS", "CTCLabelDecode", "SegPostProcess"]
