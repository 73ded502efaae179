"""Build the task components (model, loss, post-process, metric) from a config."""

from __future__ import annotations

import copy
from typing import Any, Mapping

from torch import nn

import ppdist.components  # noqa: F401  (registers every component)
from ppdist.config import STAGE_PRETRAINED_KEY, inject_globals, shared_global_values
from ppdist.registry import BACKBONES, HEADS, LOSSES, METRICS, NECKS, POSTPROCESSES


def _build_with_globals(registry: Any, config: Mapping[str, Any], section: str) -> Any:
    entry = dict(config[section])
    name = entry.pop("name")
    kwargs = inject_globals(registry, name, entry, shared_global_values(config))
    return registry.build(dict(kwargs, name=name), where=section)


def build_postprocess(config: Mapping[str, Any]) -> Any:
    return _build_with_globals(POSTPROCESSES, config, "PostProcess")


def build_loss(config: Mapping[str, Any]) -> Any:
    return _build_with_globals(LOSSES, config, "Loss")


def build_metric(config: Mapping[str, Any]) -> Any:
    return _build_with_globals(METRICS, config, "Metric")


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """The ``nn.Module`` described by ``config['Architecture']``.

    As in PaddleOCR, a head with an ``out_channels`` parameter that the config leaves unset
    gets the post-process's class count (e.g. the dictionary size + blank for CTC).
    """
    from ppdist.modeling.architectures import BaseModel

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
    shared = shared_global_values(config)
    for key, registry in (("Backbone", BACKBONES), ("Neck", NECKS), ("Head", HEADS)):
        if arch.get(key):
            arch[key] = dict(
                inject_globals(registry, arch[key]["name"], arch[key], shared), name=arch[key]["name"]
            )
    return BaseModel(arch)
