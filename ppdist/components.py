"""Import every component module so that the registries are populated."""

import ppdist.data  # noqa: F401  (datasets and transforms)
import ppdist.engine.optim  # noqa: F401  (optimizers, LR schedules, regularizers)
import ppdist.losses  # noqa: F401
import ppdist.metrics  # noqa: F401
import ppdist.modeling  # noqa: F401
import ppdist.postprocess  # noqa: F401
