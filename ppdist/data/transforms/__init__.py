"""Data transforms ("ops"); importing this package registers all of them in ``TRANSFORMS``."""

from ppdist.data.transforms import common, det, det_batch, det_resize, rec, rec_concat, rec_labels, seg, table  # noqa: F401  (registration)
from ppdist.data.transforms.common import DecodeImage, KeepKeys, NormalizeImage, Permute
from ppdist.data.transforms.det import (
    BatchRandomResize,
    Decode,
    PadGT,
    RandomCrop,
    RandomExpand,
    RandomFlip,
)
from ppdist.data.transforms.det_batch import PadBatch
from ppdist.data.transforms.det_resize import RandomResize
from ppdist.data.transforms.rec import CTCLabelEncode, RecAug, RecResizeImg
from ppdist.data.transforms.rec_concat import RecConAug
from ppdist.data.transforms.rec_labels import MultiLabelEncode, SARLabelEncode
from ppdist.data.transforms.seg import (
    Normalize,
    RandomDistort,
    RandomHorizontalFlip,
    RandomPaddingCrop,
    RandomVerticalFlip,
    Resize,
    ResizeStepScaling,
)
from ppdist.data.transforms.table import (
    PaddingTableImage,
    ResizeTableImage,
    TableBoxEncode,
    TableLabelEncode,
    ToCHWImage,
)

__all__ = [
    "DecodeImage",
    "KeepKeys",
    "BatchRandomResize",
    "RandomResize",
    "PadBatch",
    "Decode",
    "NormalizeImage",
    "PadGT",
    "Permute",
    "RandomCrop",
    "RandomExpand",
    "RandomFlip",
    "CTCLabelEncode",
    "RecAug",
    "RecResizeImg",
    "RecConAug",
    "MultiLabelEncode",
    "SARLabelEncode",
    "Normalize",
    "RandomDistort",
    "RandomHorizontalFlip",
    "RandomPaddingCrop",
    "RandomVerticalFlip",
    "Resize",
    "ResizeStepScaling",
    "PaddingTableImage",
    "ResizeTableImage",
    "TableBoxEncode",
    "TableLabelEncode",
    "ToCHWImage",
]
