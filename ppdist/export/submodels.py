"""Composite models (``Architecture.Models``, e.g. PaddleOCR's ``DistillationModel``) as export and
inference see them: every sub-model is a plain model of its own config, and one of them is deployed.

A sub-model's config is the training config with ``Architecture`` = its ``Models`` entry (without
the training-only ``freeze_params`` / ``pretrained`` / ``return_all_feats``: one output, the eval
output of a plain model), the composite post-process and metric replaced by the plain ones they
wrap (``DistillationCTCLabelDecode`` -> ``CTCLabelDecode`` with the same dictionary,
``DistillationMetric`` -> its ``base_metric_name``), and no ``Loss``. The deployed sub-model is
the one ``Metric.key`` names (the model PaddleOCR evaluates), else ``Student``, else the first.
This is the only module of export/inference that knows about composite models.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml
from torch import nn

from ppdist.components import build_model
from ppdist.config.schema import STAGE_PRETRAINED_KEY
from ppdist.errors import ConfigError
from ppdist.export.inference_config import FILE_NAME
from ppdist.modeling.deploy import convert_to_deploy
from ppdist.registry import POSTPROCESSES

# the plain post-process each composite post-process applies to every sub-model's output
PLAIN_POSTPROCESS = {"DistillationCTCLabelDecode": "CTCLabelDecode"}
COMPOSITE_METRIC_KEYS = ("key", "base_metric_name")  # DistillationMetric's own keys
TRAINING_ONLY_KEYS = ("freeze_params", STAGE_PRETRAINED_KEY, "return_all_feats")
DEFAULT_DEPLOYED = "Student"


def sub_model_names(config: Mapping[str, Any]) -> List[str]:
    """The names of ``Architecture.Models`` in their order; empty for a plain model."""
    models = (config.get("Architecture") or {}).get("Models")
    return [str(name) for name in models] if isinstance(models, Mapping) else []


def deployed_name(config: Mapping[str, Any]) -> str:
    """The sub-model users deploy: ``Metric.key`` when it names one, else ``Student``, else the first."""
    names = sub_model_names(config)
    if not names:
        raise ConfigError("Architecture has no Models: it is not a composite (distillation) model")
    key = (config.get("Metric") or {}).get("key")
    if key in names:
        return str(key)
    return DEFAULT_DEPLOYED if DEFAULT_DEPLOYED in names else names[0]


def plain_postprocess(entry: Mapping[str, Any]) -> Dict[str, Any]:
    """The plain post-process of a composite one, with the keys of it that the plain one takes; a
    post-process that is not composite as it is."""
    name = entry.get("name")
    if name not in PLAIN_POSTPROCESS:
        return dict(entry)
    plain = PLAIN_POSTPROCESS[name]
    accepted, _ = POSTPROCESSES.accepted_keys(plain)
    return {"name": plain, **{k: v for k, v in entry.items() if k in accepted and k != "name"}}


def plain_metric(entry: Mapping[str, Any]) -> Dict[str, Any]:
    """``DistillationMetric``'s base metric with its keywords; any other metric as it is."""
    if entry.get("name") != "DistillationMetric":
        return dict(entry)
    own = {k: v for k, v in entry.items() if k not in COMPOSITE_METRIC_KEYS and k != "name"}
    return {"name": entry.get("base_metric_name", "RecMetric"), **own}


def sub_config(config: Mapping[str, Any], name: str) -> Dict[str, Any]:
    """The plain config of sub-model ``name`` (see the module docstring)."""
    names = sub_model_names(config)
    if name not in names:
        raise ConfigError(f"Architecture.Models has no model {name!r} (models: {', '.join(names)})")
    arch = config["Architecture"]["Models"][name]
    out = {k: copy.deepcopy(v) for k, v in config.items() if k not in ("Architecture", "Loss")}
    out["Architecture"] = {k: copy.deepcopy(v) for k, v in arch.items() if k not in TRAINING_ONLY_KEYS}
    out["PostProcess"] = plain_postprocess(config["PostProcess"])
    if config.get("Metric"):
        out["Metric"] = plain_metric(config["Metric"])
    return out


def deployed_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The deployed sub-model's config for a composite model, else ``config`` itself."""
    return sub_config(config, deployed_name(config)) if sub_model_names(config) else config


def split_model(
    model: nn.Module, config: Mapping[str, Any], names: Optional[Sequence[str]] = None
) -> Dict[str, Tuple[nn.Module, Dict[str, Any]]]:
    """``{name: (plain eval-mode model, its config)}`` of a loaded composite ``model`` for ``names``
    (default: every sub-model, in the order of ``Architecture.Models``): each built from its config
    and given the weights of ``model.<name>`` (the composite's state-dict keys ``<name>.backbone...``)."""
    parts = {}
    for name in sub_model_names(config) if names is None else names:
        part_config = sub_config(config, name)
        plain = convert_to_deploy(build_model(part_config))
        source = getattr(model, name, None)
        if not isinstance(source, nn.Module):
            raise ConfigError(f"the model built from Architecture has no sub-model {name!r}")
        plain.load_state_dict(source.state_dict())
        parts[name] = (plain.eval(), part_config)
    return parts


def inference_parts(
    model: nn.Module, config: Mapping[str, Any]
) -> Tuple[Optional[str], List[Tuple[Optional[str], nn.Module, Mapping[str, Any]]]]:
    """What inference runs, and which of it gives the results: ``(None, [(None, model, config)])``
    for a plain model; for a composite, the deployed sub-model's name and ``(name, plain sub-model,
    its config)`` of the models the post-process decodes (``PostProcess.model_name``, in its order,
    as PaddleOCR's infer_rec reports them; every sub-model when it names none of them), the
    deployed one added when it is not among them."""
    names = sub_model_names(config)
    if not names:
        return None, [(None, model, config)]
    deployed = deployed_name(config)
    decoded = (config.get("PostProcess") or {}).get("model_name")
    decoded = [decoded] if isinstance(decoded, str) else list(decoded or [])
    order = [name for name in decoded if name in names] or list(names)
    order += [deployed] if deployed not in order else []
    parts = split_model(model, config, order)
    return deployed, [(name, *parts[name]) for name in order]


def deployed_part(model: nn.Module, config: Mapping[str, Any]) -> Tuple[nn.Module, Mapping[str, Any]]:
    """The deployed plain sub-model and its config for a composite, else ``(model, config)``."""
    if not sub_model_names(config):
        return model, config
    name = deployed_name(config)
    return split_model(model, config, [name])[name]


def exported_sub_models(model_dir: str) -> Dict[str, bool]:
    """``{sub-model name: whether it is the deployed one}`` of the folders of ``model_dir`` that
    ``export_model`` wrote for a composite model (``<name>/inference.yml`` whose ``export.sub_model``
    is ``<name>``); empty when ``model_dir`` has an ``inference.yml`` of its own or no such folder."""
    if not os.path.isdir(model_dir) or os.path.isfile(os.path.join(model_dir, FILE_NAME)):
        return {}
    found = {}
    for name in sorted(os.listdir(model_dir)):
        path = os.path.join(model_dir, name, FILE_NAME)
        try:
            with open(path, encoding="utf-8") as handle:
                export = (yaml.safe_load(handle) or {}).get("export")
        except (OSError, yaml.YAMLError, UnicodeDecodeError, AttributeError):
            continue
        if isinstance(export, dict) and export.get("sub_model") == name:
            found[name] = export.get("deployed") is True
    return found


def deployed_export_dir(model_dir: str) -> Optional[str]:
    """The deployed sub-model's folder when ``model_dir`` is a composite model's export root (the
    one marked deployed, else ``Student``, else the first); None for any other folder."""
    found = exported_sub_models(model_dir)
    if not found:
        return None
    marked = [name for name, deployed in found.items() if deployed]
    name = marked[0] if marked else DEFAULT_DEPLOYED if DEFAULT_DEPLOYED in found else next(iter(found))
    return os.path.join(model_dir, name)
