"""PaddleSeg's ``model`` section -> ppdist's ``Architecture`` (PP-LiteSeg, SegFormer, OCRNet).

Each family names the ppdist head that takes the model's own arguments and the backbone factories
it accepts; a backbone's optional arguments are written only when the config sets them (ppdist's
components default to PaddleSeg's values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Sequence, Tuple

from ppdist.config import STAGE_PRETRAINED_KEY
from ppdist.convert.configs.common import Keys, Report, component, fix_path, is_url
from ppdist.errors import ConfigError
from ppdist.registry import BACKBONES, HEADS

STDC_LAYERS = {"STDC1": [2, 2, 2], "STDC2": [4, 5, 3]}
MIT_NAMES = tuple(f"MixVisionTransformer_B{i}" for i in range(6))
HRNET_NAMES = (
    "HRNet_W18_Small_V1",
    "HRNet_W18_Small_V2",
    "HRNet_W18",
    "HRNet_W30",
    "HRNet_W32",
    "HRNet_W40",
    "HRNet_W44",
    "HRNet_W48",
    "HRNet_W60",
    "HRNet_W64",
)
# PaddleSeg / Paddle constructor defaults of the components ppdist implements.
PPLITESEG_DEFAULTS = {
    "backbone_indices": [2, 3, 4],
    "arm_type": "UAFM_SpAtten",
    "cm_bin_sizes": [1, 2, 4],
    "cm_out_ch": 128,
    "arm_out_chs": [64, 96, 128],
    "seg_head_inter_chs": [64, 64, 64],
    "resize_mode": "bilinear",
}


@dataclass(frozen=True)
class SegFamily:
    """A PaddleSeg model type: the ppdist head of its arguments and its backbone factories."""

    head: str
    backbones: Tuple[str, ...]
    head_defaults: Mapping[str, Any]  # the PaddleSeg model's optional arguments and defaults
    required: Tuple[str, ...] = ()  # the PaddleSeg model's arguments without a default


FAMILIES: Dict[str, SegFamily] = {
    "PPLiteSeg": SegFamily("PPLiteSegHead", tuple(STDC_LAYERS), PPLITESEG_DEFAULTS),
    "SegFormer": SegFamily("SegFormerHead", MIT_NAMES, {"align_corners": False}, ("embedding_dim",)),
    "OCRNet": SegFamily(
        "OCRHead",
        HRNET_NAMES,
        {"ocr_mid_channels": 512, "ocr_key_channels": 256, "align_corners": False},
        ("backbone_indices",),
    ),
}
# Optional arguments of the backbone factories (PaddleSeg's values when the config leaves them out),
# which ppdist's backbones take under the same names.
MIT_DEFAULTS = {"drop_rate": 0.0, "attn_drop_rate": 0.0, "drop_path_rate": 0.1}
HRNET_DEFAULTS = {"has_se": False, "align_corners": False, "padding_same": True}
BACKBONE_DEFAULTS: Dict[str, Mapping[str, Any]] = {
    **{name: MIT_DEFAULTS for name in MIT_NAMES},
    **{name: HRNET_DEFAULTS for name in HRNET_NAMES},
}


def contract_component(
    registry: Any, name: str, values: Mapping[str, Any], explicit: Sequence[str]
) -> Dict[str, Any]:
    """``component`` when ppdist has ``name`` (PaddleSeg's defaults written where ppdist's differ);
    otherwise the keys the config set, which ppdist's component (PaddleSeg's defaults) reads alike."""
    if name in registry:
        return component(registry, name, values, explicit)
    return {"name": name, **{k: values[k] for k in explicit if k in values}}


def convert_seg_model(sec: Keys, path: str, num_classes: Any, report: Report) -> Tuple[Dict[str, Any], Any]:
    """``(Architecture, model.pretrained path or None)`` from PaddleSeg's ``model`` section."""
    kind = sec.get("type")
    family = FAMILIES.get(kind)
    if family is None:
        raise ConfigError(
            f"{path}: model type {kind!r} is not supported (model.type): ppdist converts "
            f"{', '.join(FAMILIES)}"
        )
    if sec.get("num_classes") is not None and sec.get("num_classes") != num_classes:
        raise ConfigError(
            f"{path}: model.num_classes {sec.get('num_classes')} differs from the "
            f"train_dataset's {num_classes}"
        )
    backbone = convert_backbone(sec.sub("backbone"), path, family, report)
    for key in family.required:
        if sec.get(key) is None:
            raise ConfigError(f"{path}: model.{key} is required for model type {kind} (as in PaddleSeg)")
    values = dict(family.head_defaults)
    explicit = [k for k in family.required + tuple(family.head_defaults) if k in sec]
    values.update({k: sec.get(k) for k in explicit})
    head = contract_component(HEADS, family.head, values, explicit)
    pretrained = sec.get("pretrained")
    sec.finish()
    arch = {"model_type": "seg", "algorithm": kind, "Backbone": backbone, "Head": head}
    return arch, pretrained


def convert_backbone(sec: Keys, path: str, family: SegFamily, report: Report) -> Dict[str, Any]:
    """ppdist's ``Backbone`` entry for ``model.backbone``."""
    kind = sec.get("type")
    if kind not in family.backbones:
        raise ConfigError(
            f"{path}: model.backbone.type {kind!r} is not supported for this model type "
            f"(ppdist has {', '.join(family.backbones)})"
        )
    if kind in STDC_LAYERS:
        out: Dict[str, Any] = {"name": kind}
        for key, default in (("base", 64), ("block_num", 4), ("in_channels", 3)):
            if key in sec and sec.get(key) != default:
                out[key] = sec.get(key)
        sec.expect("layers", STDC_LAYERS[kind], f"ppdist's {kind} has the layers {STDC_LAYERS[kind]}")
        sec.expect("relative_lr", 1.0, "no per-layer learning-rate multiplier in ppdist")
    else:
        explicit = [key for key in BACKBONE_DEFAULTS[kind] if key in sec]
        values = dict(BACKBONE_DEFAULTS[kind], **{key: sec.get(key) for key in explicit})
        out = contract_component(BACKBONES, kind, values, explicit)
        sec.expect("in_channels", 3, f"ppdist's {kind} reads 3-channel images")
        if kind in MIT_NAMES:
            sec.expect("qk_scale", None, "ppdist's attention scale is head_dim ** -0.5")
            sec.skip("img_size", "it sets no weight or computation in PaddleSeg's backbone")
            sec.skip("num_classes", "PaddleSeg's backbone does not use it")
        else:
            sec.expect("use_psa", False, "no polarized self-attention in ppdist's HRNet")
    pretrained = sec.get("pretrained")
    if pretrained:
        if is_url(pretrained):
            tarball = pretrained.endswith(".tar.gz")
            archive = " (a .tar.gz: extract it and use its model.pdparams)" if tarball else ""
            report.unmapped_key(
                "model.backbone.pretrained",
                "a URL; ppdist does not download weights: "
                f"download it{archive} and give the local .pdparams path with "
                f"-o Architecture.Backbone.{STAGE_PRETRAINED_KEY}=PATH",
                pretrained,
            )
        else:
            out[STAGE_PRETRAINED_KEY] = fix_path(pretrained, path, "model.backbone.pretrained", report)
    sec.finish()
    return out
