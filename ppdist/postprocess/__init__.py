"""Post-processing; importing this package registers it in ``POSTPROCESSES``."""

from ppdist.postprocess.ctc_decode import CTCLabelDecode
from ppdist.postprocess.distillation import DistillationCTCLabelDecode
from ppdist.postprocess.nms import MultiClassNMS
from ppdist.postprocess.rcnn import BBoxPostProcess
from ppdist.postprocess.sar_decode import SARLabelDecode
from ppdist.postprocess.seg import SegPostProcess
from ppdist.postprocess.table_decode import TableLabelDecode

__all__ = [
    "BBoxPostProcess",
    "CTCLabelDecode",
    "DistillationCTCLabelDecode",
    "MultiClassNMS",
    "SARLabelDecode",
    "SegPostProcess",
    "TableLabelDecode",
]
