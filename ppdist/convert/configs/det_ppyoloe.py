"""PaddleDetection's PP-YOLOE family (architecture ``PPYOLOE`` or ``YOLOv3`` with CSPResNet,
CustomCSPPAN and PPYOLOEHead) -> ppdist's Architecture, Loss and PostProcess sections.

Called by ``paddledetection.DetConverter`` through its ``FAMILIES`` table with the converter
(the config's keys, the report, ``shared`` for ``__shared__`` keys, ``nms`` for MultiClassNMS)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from ppdist.convert.configs.common import Keys, component
from ppdist.errors import ConfigError
from ppdist.registry import BACKBONES, HEADS, LOSSES, NECKS, POSTPROCESSES

if TYPE_CHECKING:
    from ppdist.convert.configs.paddledetection import DetConverter

# PaddleDetection constructor defaults of the components ppdist implements (facts of its API).
CSPRESNET_DEFAULTS = {
    "layers": [3, 6, 6, 3],
    "channels": [64, 128, 256, 512, 1024],
    "act": "swish",
    "return_idx": [1, 2, 3],
    "use_large_stem": False,
    "use_alpha": False,
}
FREEZE_KEYS = ("freeze_at", "frozen_stages", "freeze_norm")  # PaddleDetection's ResNet keys, mmdetection's
CSPPAN_DEFAULTS = {
    "out_channels": [1024, 512, 256],
    "act": "leaky",
    "stage_num": 1,
    "block_num": 3,
    "spp": False,
    "use_alpha": False,
}
HEAD_DEFAULTS = {
    "act": "swish",
    "fpn_strides": [32, 16, 8],
    "grid_cell_scale": 5.0,
    "grid_cell_offset": 0.5,
    "reg_max": 16,
}
LOSS_DEFAULTS = {
    "static_assigner_epoch": 4,
    "use_varifocal_loss": True,
    "loss_weight": {"class": 1.0, "iou": 2.5, "dfl": 0.5},
}
ATSS_DEFAULTS = {"topk": 9}
TAL_DEFAULTS = {"topk": 13, "alpha": 1.0, "beta": 6.0}


def convert_ppyoloe(conv: DetConverter, name: str) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
    """PP-YOLOE's ``(Architecture, Loss, PostProcess)``: CSPResNet, CustomCSPPAN, PPYOLOEHead (its
    assigners and MultiClassNMS), PaddleDetection's constructor defaults where a key is absent."""
    top, report = conv.top, conv.report
    meta = top.sub(name)
    parts = {"backbone": "CSPResNet", "neck": "CustomCSPPAN", "yolo_head": "PPYOLOEHead"}
    for key, expected in parts.items():
        value = meta.get(key)
        if value != expected:
            raise ConfigError(
                f"{conv.path}: {name}.{key} {value!r} is not supported: ppdist converts PP-YOLOE "
                f"({', '.join(f'{k}: {v}' for k, v in parts.items())})"
            )
    if meta.get("post_process") is not None:
        report.unmapped_key(
            f"{name}.post_process",
            "ppdist uses the head's MultiClassNMS post-process",
            meta.get("post_process"),
        )
    meta.expect("data_format", "NCHW", "ppdist runs NCHW (see Global.channels_last)")
    meta.expect("for_mot", False, "no tracking in ppdist")
    meta.finish()

    width = {k: conv.shared(top.sub(k), "width_mult", 1.0) for k in ("CSPResNet", "CustomCSPPAN")}
    depth = {k: conv.shared(top.sub(k), "depth_mult", 1.0) for k in ("CSPResNet", "CustomCSPPAN")}
    top.get("width_mult")
    top.get("depth_mult")
    per_component = len(set(width.values())) > 1 or len(set(depth.values())) > 1
    if not per_component:
        conv.glob["width_mult"] = float(width["CSPResNet"])
        conv.glob["depth_mult"] = float(depth["CSPResNet"])
    backbone = _backbone(conv, BACKBONES, per_component)
    neck = _neck(conv, NECKS, per_component)
    head, loss, post = _head(conv, HEADS, LOSSES, POSTPROCESSES)
    arch = {"model_type": "det", "algorithm": "PPYOLOE", "Backbone": backbone, "Neck": neck, "Head": head}
    return arch, loss, post


def _section_values(
    conv: DetConverter, sec: Any, defaults: Dict[str, Any], per_component: bool
) -> Tuple[Dict[str, Any], List[str]]:
    """Paddle's defaults overridden by the section's keys (the explicit ones listed), plus the
    width/depth multipliers when backbone and neck have their own."""
    values = dict(defaults)
    explicit = [k for k in defaults if k in sec]
    values.update({k: sec.get(k) for k in explicit})
    if per_component:
        values.update(
            width_mult=conv.shared(sec, "width_mult", 1.0), depth_mult=conv.shared(sec, "depth_mult", 1.0)
        )
        explicit += ["width_mult", "depth_mult"]
    sec.get("width_mult")  # read (as global values) either way: not "unconverted"
    sec.get("depth_mult")
    return values, explicit


def _backbone(conv: DetConverter, registry: Any, per_component: bool) -> Dict[str, Any]:
    sec = conv.top.sub("CSPResNet")
    values, explicit = _section_values(conv, sec, CSPRESNET_DEFAULTS, per_component)
    sec.expect("depth_wise", False, "ppdist's CSPResNet has no depth-wise variant")
    sec.expect("trt", False, "TensorRT-specific activation")
    sec.expect("use_checkpoint", False, "no gradient checkpointing in ppdist")
    for key in FREEZE_KEYS:  # fine-tuning settings a user adds (ppdist.modeling.freezing)
        if key in sec:
            values[key] = sec.get(key)
            explicit.append(key)
    sec.finish()
    return component(registry, "CSPResNet", values, explicit)


def _neck(conv: DetConverter, registry: Any, per_component: bool) -> Dict[str, Any]:
    sec = conv.top.sub("CustomCSPPAN")
    values, explicit = _section_values(conv, sec, CSPPAN_DEFAULTS, per_component)
    if "in_channels" in sec:
        sec.get("in_channels")
        conv.report.note(
            "CustomCSPPAN.in_channels: taken from the backbone's outputs (as PaddleDetection's "
            "from_config does)"
        )
    norm = conv.shared(sec, "norm_type", "bn")
    sec.get("norm_type")
    if norm not in ("bn", "sync_bn"):
        conv.report.unmapped_key("CustomCSPPAN.norm_type", "ppdist's neck uses BatchNorm", norm)
    sec.expect("stage_fn", "CSPStage", "ppdist's neck has CSPStage stages only")
    sec.expect("block_fn", "BasicBlock", "ppdist's neck has BasicBlock blocks only")
    sec.expect("drop_block", False, "no DropBlock in ppdist")
    for key in ("block_size", "keep_prob"):  # DropBlock settings: listed through drop_block when it is on
        sec.get(key)
    sec.expect("data_format", "NCHW", "ppdist runs NCHW (see Global.channels_last)")
    sec.expect("trt", False, "TensorRT-specific activation")
    sec.expect("use_trans", False, "no transformer encoder in ppdist's CustomCSPPAN")
    for key in (
        "dim_feedforward",
        "dropout",
        "activation",
        "nhead",
        "num_layers",
        "attn_dropout",
        "act_dropout",
        "normalize_before",
        "eval_size",
    ):
        if key in sec and not sec.data.get("use_trans"):
            sec.get(key)  # only used by the transformer encoder, which is off
    sec.finish()
    return component(registry, "CustomCSPPAN", values, explicit)


def _head(
    conv: DetConverter, heads: Any, losses: Any, posts: Any
) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
    top, report = conv.top, conv.report
    sec = top.sub("PPYOLOEHead")
    num_classes = conv.shared(sec, "num_classes", 80)
    top.get("num_classes")
    sec.get("num_classes")
    conv.glob["num_classes"] = int(num_classes)
    values = dict(HEAD_DEFAULTS)
    explicit = [k for k in HEAD_DEFAULTS if k in sec]
    values.update({k: sec.get(k) for k in explicit})
    eval_size = conv.shared(sec, "eval_size", None)
    sec.get("eval_size")
    if eval_size is not None:
        values["eval_size"] = list(eval_size)
        explicit.append("eval_size")
        for key in ("eval_height", "eval_width", "eval_size"):
            if key in top:
                top.get(key)
    if "in_channels" in sec:
        sec.get("in_channels")
        report.note(
            "PPYOLOEHead.in_channels: taken from the neck's outputs (as PaddleDetection's from_config does)"
        )
    head = component(heads, "PPYOLOEHead", values, explicit)

    loss_values = dict(LOSS_DEFAULTS)
    loss_explicit = [k for k in LOSS_DEFAULTS if k in sec]
    loss_values.update({k: sec.get(k) for k in loss_explicit})
    loss_values["reg_max"] = values["reg_max"]
    loss_values["static_assigner"] = _assigner(conv, sec, "static_assigner", "ATSSAssigner", ATSS_DEFAULTS)
    loss_values["assigner"] = _assigner(conv, sec, "assigner", "TaskAlignedAssigner", TAL_DEFAULTS)
    loss = component(losses, "PPYOLOELoss", loss_values, loss_explicit + ["static_assigner", "assigner"])
    post = conv.nms(sec, posts)
    sec.expect("reg_range", None, "PP-YOLOE-SOD's reg_range is not implemented")
    sec.expect("trt", False, "TensorRT-specific")
    sec.expect("attn_conv", "convbn", "ppdist's ESE attention uses a ConvBN")
    sec.expect("use_shared_conv", True, "ppdist decodes with the shared DFL projection")
    sec.expect("for_distill", False, "no distillation in ppdist")
    for key in ("exclude_nms", "exclude_post_process"):
        sec.expect(key, False, "export option; see tools/export_model.py")
        top.expect(key, False, "export option; see tools/export_model.py")
    top.expect("trt", False, "TensorRT-specific")
    top.expect("for_distill", False, "no distillation in ppdist")
    top.expect("use_shared_conv", True, "ppdist decodes with the shared DFL projection")
    sec.finish()
    return head, loss, post


def _assigner(
    conv: DetConverter, head: Keys, key: str, expected: str, defaults: Dict[str, Any]
) -> Dict[str, Any]:
    """``static_assigner``/``assigner``: a class name (its top-level section) or ``{name, **kwargs}``."""
    value = head.get(key, expected)
    name = value.get("name") if isinstance(value, dict) else value
    if name != expected:
        raise ConfigError(f"{conv.path}: PPYOLOEHead.{key} {name!r} is not supported (ppdist has {expected})")
    section = conv.top.sub(expected) if expected in conv.top else Keys({}, expected, conv.report)
    params = dict(defaults)
    for k in list(section.data):
        params[k] = section.get(k)
    if isinstance(value, dict):
        params.update({k: v for k, v in value.items() if k != "name"})
    out = {"name": expected}
    for k, v in params.items():
        if k in defaults or k == "eps":
            out[k] = v
        elif k == "num_classes" or (k in ("force_gt_matching", "sm_use", "is_close_gt") and not v):
            continue  # num_classes: Global.num_classes; the others are off, as in ppdist
        else:
            conv.report.unmapped_key(f"PPYOLOEHead.{key}.{k}", f"no such option in ppdist's {expected}", v)
    return out
