"""The architectures of ``Architecture.name``: ``BaseModel`` (the default) and ``DistillationModel``.

``BaseModel`` chains Backbone -> Neck -> Head: each stage's ``out_channels`` becomes the next
stage's ``in_channels``, and ``forward`` returns whatever the last stage returns. A stage whose
``forward`` takes an ``input_size`` keyword (e.g. a segmentation head upsampling to the image)
receives the input's spatial size; one that takes a ``batch`` keyword (a teacher-forced head)
receives the whole batch mapping (None when the model is called with a bare tensor). With
``return_all_feats`` it returns PaddleOCR's feature dict (``backbone_out``, ``neck_out``,
``head_out``) in training.

``DistillationModel`` holds one BaseModel per ``Models`` entry, as attributes named like the models
(state-dict keys ``Student.backbone...``, as PaddleOCR's), and returns ``{name: its output}``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, Optional, Union

import torch
from torch import nn

from ppdist.config.schema import ARCHITECTURE_KEYS, DISTILLATION_KEYS, STAGE_PRETRAINED_KEY
from ppdist.errors import ConfigError
from ppdist.registry import ARCHITECTURES, BACKBONES, HEADS, NECKS, Registry, did_you_mean

Batch = Union[torch.Tensor, Mapping[str, Any]]
PrepareStages = Callable[[MutableMapping[str, Any]], None]  # fills one BaseModel section in place
STAGES = ("backbone", "neck", "head")
FEATURE_NAMES = {"backbone": "backbone_out", "neck": "neck_out", "head": "head_out"}


def _stage_keywords(stage: Optional[nn.Module]) -> List[str]:
    return [] if stage is None else list(inspect.signature(stage.forward).parameters)


@ARCHITECTURES.register(name="BaseModel")
class BaseModel(nn.Module):
    """A model chained from the optional stages ``Backbone``, ``Neck`` and ``Head``."""

    def __init__(self, arch: Mapping[str, Any], where: str = "Architecture") -> None:
        super().__init__()
        if not isinstance(arch, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {type(arch).__name__}")
        for key in arch:
            if key not in ARCHITECTURE_KEYS:
                raise ConfigError(f"unknown key {where}.{key}.{did_you_mean(str(key), ARCHITECTURE_KEYS)}")
        if arch.get("Transform"):
            raise ConfigError(f"{where}.Transform (e.g. TPS) is not supported yet; set it to null")
        self.model_type = arch.get("model_type")
        self.algorithm = arch.get("algorithm")
        self.return_all_feats = bool(arch.get("return_all_feats", False))

        channels = arch.get("in_channels", 3)
        self.backbone = self._build_stage(BACKBONES, arch, "Backbone", channels, where)
        channels = getattr(self.backbone, "out_channels", channels)
        self.neck = self._build_stage(NECKS, arch, "Neck", channels, where)
        channels = getattr(self.neck, "out_channels", channels)
        self.head = self._build_stage(HEADS, arch, "Head", channels, where)
        if self.backbone is None and self.neck is None and self.head is None:
            raise ConfigError(f"{where} needs at least a Backbone, a Neck or a Head")
        self.out_channels = getattr(self.head, "out_channels", channels)
        keywords = [_stage_keywords(getattr(self, name)) for name in STAGES]
        self._wants_size = ["input_size" in names for names in keywords]
        self._wants_batch = ["batch" in names for names in keywords]

    @staticmethod
    def prepare(arch: MutableMapping[str, Any], prepare_stages: PrepareStages) -> None:
        """Fill the stage sections of ``arch`` (``components.build_model``'s injections)."""
        prepare_stages(arch)

    @staticmethod
    def _build_stage(
        registry: Registry, arch: Mapping[str, Any], key: str, in_channels: int, where: str
    ) -> Optional[nn.Module]:
        cfg = arch.get(key)
        if cfg is None:
            return None
        where = f"{where}.{key}"
        stage = registry.build(cfg, where=where, in_channels=in_channels)
        if not hasattr(stage, "out_channels"):
            raise TypeError(f"{where} {cfg['name']!r} must expose an 'out_channels' attribute")
        return stage

    def forward(self, batch: Batch) -> Any:
        """Run the stages on ``batch`` (an image tensor, or a mapping with key ``"image"``)."""
        if isinstance(batch, torch.Tensor):
            x, data = batch, None
        elif isinstance(batch, Mapping) and "image" in batch:
            x, data = batch["image"], batch
        else:
            raise TypeError(
                "BaseModel.forward expects an image tensor or a mapping with key "
                f"'image', got {type(batch).__name__}"
            )
        size = x.shape[2:]
        feats: Dict[str, Any] = {}
        final = None
        for name, wants_size, wants_batch in zip(STAGES, self._wants_size, self._wants_batch):
            stage = getattr(self, name)
            if stage is None:
                continue
            kwargs: Dict[str, Any] = {}
            if wants_size:
                kwargs["input_size"] = size
            if wants_batch:
                kwargs["batch"] = data
            x = stage(x, **kwargs)
            final = FEATURE_NAMES[name]
            if isinstance(x, dict) and name == "head" and "ctc_neck" in x:  # a multi-head's CTC sequence
                feats["neck_out"], feats["head_out"] = x["ctc_neck"], x
            elif isinstance(x, dict):
                feats.update(x)
            else:
                feats[final] = x
        if not self.return_all_feats:
            return x
        if self.training:
            return feats
        return x if isinstance(x, dict) else {final: x}


@ARCHITECTURES.register(name="DistillationModel")
class DistillationModel(nn.Module):
    """Teacher/student models side by side: ``{name: BaseModel(Models[name])(batch)}``.

    Per model, ``freeze_params: true`` makes its parameters untrainable (``requires_grad`` False;
    its BatchNorm statistics still follow the model's mode, as PaddleOCR's) and ``pretrained`` names
    weights loaded into that model alone at the start of training (``pretrained_parts``, read by
    ``engine.checkpoint.load_initial_weights`` as ``Global.pretrained_model`` for the model).
    """

    def __init__(self, arch: Mapping[str, Any], where: str = "Architecture") -> None:
        super().__init__()
        for key in arch:
            if key not in DISTILLATION_KEYS:
                raise ConfigError(
                    f"unknown key {where}.{key} for DistillationModel.{did_you_mean(key, DISTILLATION_KEYS)}"
                )
        models = arch.get("Models")
        if not isinstance(models, Mapping) or not models:
            raise ConfigError(f"{where}.Models must map model names (e.g. Teacher, Student) to architectures")
        self.model_type = arch.get("model_type")
        self.algorithm = arch.get("algorithm")
        self.model_names: List[str] = []
        self.pretrained_parts: Dict[str, str] = {}
        for name, model_arch in models.items():
            model_where = f"{where}.Models.{name}"
            if not isinstance(model_arch, Mapping):
                raise ConfigError(f"{model_where} must be a mapping (an architecture), got {model_arch!r}")
            model_arch = dict(model_arch)
            freeze = model_arch.pop("freeze_params", False)
            pretrained = model_arch.pop(STAGE_PRETRAINED_KEY, None)
            if not isinstance(freeze, bool):
                raise ConfigError(f"{model_where}.freeze_params must be true or false, got {freeze!r}")
            model = BaseModel(model_arch, where=model_where)
            if freeze:
                model.requires_grad_(False)
            if pretrained:
                self.pretrained_parts[str(name)] = str(pretrained)
            self.add_module(str(name), model)
            self.model_names.append(str(name))
        self.out_channels = getattr(self, self.model_names[0]).out_channels

    @staticmethod
    def prepare(arch: MutableMapping[str, Any], prepare_stages: PrepareStages) -> None:
        """Fill the stage sections of every model of ``arch`` (``components.build_model``'s injections)."""
        for model_arch in (arch.get("Models") or {}).values():
            if isinstance(model_arch, MutableMapping):
                prepare_stages(model_arch)

    def forward(self, batch: Batch) -> Dict[str, Any]:
        return {name: getattr(self, name)(batch) for name in self.model_names}
