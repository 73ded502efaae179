"""``BaseModel``: Backbone -> Neck -> Head built from an ``Architecture`` config section.

Task-agnostic: each stage's ``out_channels`` becomes the next stage's ``in_channels``, and
``forward`` returns whatever the last stage returns. A stage whose ``forward`` takes an
``input_size`` keyword (e.g. a segmentation head upsampling to the image) receives the
input's spatial size.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping, Optional, Union

import torch
from torch import nn

from ppdist.config.schema import ARCHITECTURE_KEYS
from ppdist.errors import ConfigError
from ppdist.registry import BACKBONES, HEADS, NECKS, Registry, did_you_mean

Batch = Union[torch.Tensor, Mapping[str, Any]]


class BaseModel(nn.Module):
    """A model chained from the optional stages ``Backbone``, ``Neck`` and ``Head``."""

    def __init__(self, arch: Mapping[str, Any]) -> None:
        super().__init__()
        if not isinstance(arch, Mapping):
            raise ConfigError(f"Architecture must be a mapping, got {type(arch).__name__}")
        for key in arch:
            if key not in ARCHITECTURE_KEYS:
                raise ConfigError(
                    f"unknown key Architecture.{key}.{did_you_mean(str(key), ARCHITECTURE_KEYS)}"
                )
        if arch.get("Transform"):
            raise ConfigError("Architecture.Transform (e.g. TPS) is not supported yet; set it to null")
        self.model_type = arch.get("model_type")
        self.algorithm = arch.get("algorithm")

        channels = arch.get("in_channels", 3)
        self.backbone = self._build_stage(BACKBONES, arch, "Backbone", channels)
        channels = getattr(self.backbone, "out_channels", channels)
        self.neck = self._build_stage(NECKS, arch, "Neck", channels)
        channels = getattr(self.neck, "out_channels", channels)
        self.head = self._build_stage(HEADS, arch, "Head", channels)
        if self.backbone is None and self.neck is None and self.head is None:
            raise ConfigError("Architecture needs at least a Backbone, a Neck or a Head")
        self.out_channels = getattr(self.head, "out_channels", channels)
        self._wants_size = [
            stage is not None and "input_size" in inspect.signature(stage.forward).parameters
            for stage in (self.backbone, self.neck, self.head)
        ]

    @staticmethod
    def _build_stage(
        registry: Registry, arch: Mapping[str, Any], key: str, in_channels: int
    ) -> Optional[nn.Module]:
        cfg = arch.get(key)
        if cfg is None:
            return None
        where = f"Architecture.{key}"
        stage = registry.build(cfg, where=where, in_channels=in_channels)
        if not hasattr(stage, "out_channels"):
            raise TypeError(f"{where} {cfg['name']!r} must expose an 'out_channels' attribute")
        return stage

    def forward(self, batch: Batch) -> Any:
        """Run the stages on ``batch`` (an image tensor, or a mapping with key ``"image"``)."""
        if isinstance(batch, torch.Tensor):
            x = batch
        elif isinstance(batch, Mapping) and "image" in batch:
            x = batch["image"]
        else:
            raise TypeError(
                "BaseModel.forward expects an image tensor or a mapping with key "
                f"'image', got {type(batch).__name__}"
            )
        size = x.shape[2:]
        for stage, wants_size in zip((self.backbone, self.neck, self.head), self._wants_size):
            if stage is not None:
                x = stage(x, input_size=size) if wants_size else stage(x)
        return x
