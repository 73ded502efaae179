"""Models; importing this package registers every backbone, neck and head."""

from ppdist.modeling import backbones, heads, necks  # noqa: F401  (registration side effects)
from ppdist.modeling.architectures import BaseModel, DistillationModel

__all__ = ["BaseModel", "DistillationModel"]
