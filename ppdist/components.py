"""Every component registered, and the builders of a task's parts: model, loss, post-process, metric.

Importing this module imports each component package, which registers its classes (datasets,
transforms, optimizers and LR schedules, losses, metrics, models, post-processes); the root
package ``ppdist`` imports it, so the registries are complete before any config is validated.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, Optional

from torch import nn

import ppdist.data  # noqa: F401  (datasets and transforms)
import ppdist.losses  # noqa: F401
import ppdist.metrics  # noqa: F401
import ppdist.modeling  # noqa: F401  (architectures, backbones, necks, heads)
import ppdist.optim  # noqa: F401  (optimizers, LR schedules, regularizers)
import ppdist.postprocess  # noqa: F401
from ppdist.builder import build_component, component_kwargs
from ppdist.config import STAGE_PRETRAINED_KEY
from ppdist.data.charset import load_characters
from ppdist.registry import ARCHITECTURES, BACKBONES, HEADS, LOSSES, METRICS, NECKS, POSTPROCESSES


def build_postprocess(config: Mapping[str, Any]) -> Any:
    return build_component(POSTPROCESSES, config["PostProcess"], config, "PostProcess")


def build_loss(config: Mapping[str, Any]) -> Any:
    return build_component(LOSSES, config["Loss"], config, "Loss")


def build_metric(config: Mapping[str, Any]) -> Any:
    return build_component(METRICS, config["Metric"], config, "Metric")


def _class_count(config: Mapping[str, Any]) -> int:
    """The CTC class count of the post-process (``num_classes``), else the dictionary's + blank."""
    count = getattr(build_postprocess(config), "num_classes", None) if config.get("PostProcess") else None
    if count is None:
        glob = config.get("Global") or {}
        count = len(load_characters(glob.get("character_dict_path"), bool(glob.get("use_space_char")))) + 1
    return int(count)


def class_vocabulary(config: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """What the model's output classes mean, as the checkpoints record it
    (``ppdist.engine.checkpoint.classes``): the post-process's class list (``character``, the
    attribute every PaddleOCR label decoder has: CTC's blank and characters, SLANet's structure
    tokens), the dictionary it was read from and the config key naming that dictionary (Global's,
    which wins, else the post-process's own). None when the post-process has no class list
    (detection, segmentation: their class count is a config value)."""
    if not config.get("PostProcess"):
        return None
    classes = getattr(build_postprocess(config), "character", None)
    if classes is None:
        return None
    entry = config["PostProcess"]
    path = component_kwargs(POSTPROCESSES, entry, config).get("character_dict_path")
    in_global = (config.get("Global") or {}).get("character_dict_path") is not None
    key = (
        "Global.character_dict_path"
        if in_global or "character_dict_path" not in entry
        else "PostProcess.character_dict_path"
    )
    return {"classes": [str(c) for c in classes], "dictionary": path, "key": key}


def multi_head_channels(count: int) -> Dict[str, int]:
    """PaddleOCR's ``out_channels_list`` for a head of ``count`` CTC classes (blank included)."""
    return {"CTCLabelDecode": count, "SARLabelDecode": count + 2, "NRTRLabelDecode": count + 3}


def _stage_preparer(config: Mapping[str, Any]) -> Callable[[MutableMapping[str, Any]], None]:
    """Fills one BaseModel section: the head's class counts (``out_channels`` / ``out_channels_list``
    from the post-process, as PaddleOCR's tools/train.py), the shared Global values of each stage,
    and no ``Backbone.pretrained`` (loaded by the trainer, not a constructor key)."""
    counts: List[int] = []  # the post-process is built once, when a head needs it

    def count() -> int:
        if not counts:
            counts.append(_class_count(config))
        return counts[0]

    def prepare(arch: MutableMapping[str, Any]) -> None:
        head = arch.get("Head")
        if isinstance(head, Mapping) and head.get("name") in HEADS:
            head = dict(head)
            accepted, _ = HEADS.accepted_keys(head["name"])
            if "out_channels" in accepted and head.get("out_channels") is None:
                head["out_channels"] = count()
            if "out_channels_list" in accepted and head.get("out_channels_list") is None:
                head["out_channels_list"] = multi_head_channels(count())
            arch["Head"] = head
        if arch.get("Backbone"):
            arch["Backbone"] = {k: v for k, v in arch["Backbone"].items() if k != STAGE_PRETRAINED_KEY}
        for key, registry in (("Backbone", BACKBONES), ("Neck", NECKS), ("Head", HEADS)):
            if arch.get(key):  # BaseModel builds the stages: it chains their channels
                arch[key] = dict(component_kwargs(registry, arch[key], config), name=arch[key]["name"])

    return prepare


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """The ``nn.Module`` described by ``config['Architecture']``: the architecture named by its
    ``name`` (``BaseModel`` when absent, ``DistillationModel``), stages filled by ``_stage_preparer``."""
    arch = copy.deepcopy(dict(config["Architecture"]))
    architecture = ARCHITECTURES.get(arch.get("name", "BaseModel"), where="Architecture.name")
    architecture.prepare(arch, _stage_preparer(config))
    return architecture(arch)
