"""Datasets, transforms, samplers and loaders."""

import ppdist.data.det  # noqa: F401  (registers COCODataSet)
import ppdist.data.rec  # noqa: F401  (registers SimpleDataSet, LMDBDataSet)
import ppdist.data.seg  # noqa: F401  (registers SegDataSet, CityscapesDataSet)
import ppdist.data.transforms  # noqa: F401  (registers the transform ops)
