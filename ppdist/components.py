"""Every component registered, and the builders of a task's parts: model, loss, post-process, metric.

Importing this module imports each component package, which registers its classes (datasets,
transforms, optimizers and LR schedules, losses, metrics, models, post-processes); the root
package ``ppdist`` imports it, so the registries are complete before any config is validated.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from torch import nn

import ppdist.data  # noqa: F401  (datasets and transforms)
import ppdist.engine.optim  # noqa: F401  (optimizers, LR schedules, regularizers)
import ppdist.losses  # noqa: F401
import ppdist.metrics  # noqa: F401
import ppdist.postprocess  # noqa: F401
from ppdist.builder import build_component, component_kwargs
from ppdist.config import STAGE_PRETRAINED_KEY
from ppdist.modeling import BaseModel
from ppdist.registry import BACKBONES, HEADS, LOSSES, METRICS, NECKS, POSTPROCESSES


def build_postprocess(config: Mapping[str, Any]) -> Any:
    return build_component(POSTPROCESSES, config["PostProcess"], config, "PostProcess")


def build_loss(config: Mapping[str, Any]) -> Any:
    return build_component(LOSSES, config["Loss"], config, "Loss")


def build_metric(config: Mapping[str, Any]) -> Any:
    return build_component(METRICS, config["Metric"], config, "Metric")


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """The ``nn.Module`` described by ``config['Architecture']``.

    As in PaddleOCR, a head with an ``out_channels`` parameter that the config leaves unset
    gets the post-process's class count (e.g. the dictionary size + blank for CTC).
    """
    arch = copy.deepcopy(dict(config["Architecture"]))
    head = arch.get("Head") or {}
    accepted, _ = HEADS.accepted_keys(head["name"])
    if "out_channels" in accepted and head.get("out_channels") is None:
        postprocess = build_postprocess(config)
        count = getattr(postprocess, "num_classes", None)
        if count is not None:
            head["out_channels"] = int(count)
    arch["Head"] = head
    if arch.get("Backbone"):  # loaded by the trainer (checkpoint.load_initial_weights), not a constructor key
        arch["Backbone"] = {k: v for k, v in arch["Backbone"].items() if k != STAGE_PRETRAINED_KEY}
    for key, registry in (("Backbone", BACKBONES), ("Neck", NECKS), ("Head", HEADS)):
        if arch.get(key):  # BaseModel builds the stages: it chains their channels
            arch[key] = dict(component_kwargs(registry, arch[key], config), name=arch[key]["name"])
    return BaseModel(arch)
