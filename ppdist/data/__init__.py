"""Datasets, transforms, samplers and loaders."""

import ppdist.data.det  # noqa: F401  (registers COCODataSet)
import ppdist.data.rec  # noqa: F401  (registers SimpleDataSet, LMDBDataSet)
import ppdist.data.seg  # noqa: F401  (registers SegDataSet, CityscapesDataSet)
import ppdist.data.synthetic  # noqa: F401  (registers the rec synthetic data generator)
import ppdist.data.synthetic_det  # noqa: F401  (registers the det synthetic data generator)
import ppdist.data.synthetic_ppocr  # noqa: F401  (registers the PP-OCRv3 synthetic text lines)
import ppdist.data.synthetic_seg  # noqa: F401  (registers the seg synthetic data generator)
import ppdist.data.synthetic_table  # noqa: F401  (registers the table synthetic data generator)
import ppdist.data.table  # noqa: F401  (registers PubTabDataSet)
import ppdist.data.transforms  # noqa: F401  (registers the transform ops)
