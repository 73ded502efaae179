"""PaddleDetection's Faster R-CNN (architecture ``FasterRCNN`` with ResNet / ResNeXt, FPN,
RPNHead, BBoxHead with TwoFCHead or Res5Head, BBoxPostProcess) and Cascade R-CNN (``CascadeRCNN``:
the same with ``CascadeHead`` + ``CascadeTwoFCHead``; a ``mask_head`` is refused in one line) ->
ppdist's Architecture, Loss and PostProcess.

Called by ``paddledetection.DetConverter`` through its ``FAMILIES`` table. The model becomes
``Backbone: ResNet``, ``Neck: FPN`` and ``Head: FasterRCNNHead`` holding ``rpn_head`` and
``bbox_head`` entries with PaddleDetection's class and keyword names (sections the config names
by class, ``head: TwoFCHead``, ``bbox_assigner: BBoxAssigner``, ``decode: RCNNBox``, become
``{name, **that section}``). What PaddleDetection's ``from_config`` derives from the shapes is
written out: FPN's ``spatial_scales`` from ResNet's ``return_idx``, the head's ``feat_strides``
(FPN's levels, P6 included). ``num_classes`` (``__shared__``) goes to Global and to the parts
that take it. The C4 model (no neck, ``BBoxHead.head: Res5Head``) keeps its single stride-16 map;
Swin backbones are refused in one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from ppdist.convert.configs.common import Keys, component
from ppdist.errors import ConfigError
from ppdist.ops.box_coder import CASCADE_BBOX_WEIGHTS
from ppdist.registry import BACKBONES, NECKS

if TYPE_CHECKING:
    from ppdist.convert.configs.paddledetection import DetConverter

# PaddleDetection constructor defaults (facts of its API) of the keys ppdist writes out.
RESNET_KEYS = (
    "depth",
    "ch_in",
    "variant",
    "lr_mult_list",
    "groups",
    "base_width",
    "norm_decay",
    "freeze_norm",
    "freeze_at",
    "return_idx",
    "dcn_v2_stages",
    "num_stages",
    "std_senet",
    "freeze_stem_only",
)
RESNET_DEFAULTS = {
    "depth": 50,
    "variant": "b",
    "freeze_norm": True,
    "freeze_at": 0,
    "return_idx": [0, 1, 2, 3],
}
FPN_KEYS = ("out_channel", "has_extra_convs", "extra_stage", "use_c5", "norm_type", "relu_before_extra_convs")
FPN_DEFAULTS = {"has_extra_convs": False, "extra_stage": 1, "use_c5": True, "relu_before_extra_convs": True}
PARTS = {
    "backbone": "ResNet",
    "neck": "FPN",
    "rpn_head": "RPNHead",
    "bbox_head": "BBoxHead",
    "bbox_post_process": "BBoxPostProcess",
}
CASCADE_PARTS = dict(PARTS, bbox_head="CascadeHead")
RPN_KEYS = ("anchor_generator", "rpn_target_assign", "train_proposal", "test_proposal")
BBOX_HEAD_KEYS = ("roi_extractor", "with_pool", "bbox_weight", "loss_normalize_pos")
CASCADE_HEAD_KEYS = (
    "roi_extractor",
    "bbox_weight",
    "num_cascade_stages",
    "reg_class_agnostic",
    "stage_loss_weights",
    "loss_normalize_pos",
    "add_gt_as_proposals",
)


def convert_faster_rcnn(
    conv: DetConverter, name: str
) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
    """Faster R-CNN's ``(Architecture, Loss, PostProcess)`` (module docs)."""
    meta = conv.top.sub(name)
    cascade = name == "CascadeRCNN"
    parts = CASCADE_PARTS if cascade else PARTS
    for key in ("mask_head", "mask_post_process"):
        if meta.get(key) is not None:
            raise ConfigError(
                f"{conv.path}: {name}.{key} {meta.get(key)!r}: mask heads (Mask R-CNN, Cascade Mask R-CNN) "
                f"are not supported; ppdist trains the box detector"
            )
    for key, expected in parts.items():
        value = meta.get(key)
        if key == "backbone" and isinstance(value, str) and value.startswith("Swin"):
            raise ConfigError(
                f"{conv.path}: {name}.backbone {value!r}: Swin backbones are not supported (ResNet)"
            )
        if value != expected and not (key == "neck" and value is None):
            raise ConfigError(
                f"{conv.path}: {name}.{key} {value!r} is not supported: ppdist converts {name} "
                f"({', '.join(f'{k}: {v}' for k, v in parts.items())}; neck may be absent)"
            )
    meta.finish()
    conv.backbone_file_prefixes = ("resnext",)  # ResNeXt101_vd_64x4d_pretrained.pdparams: ResNet's weights
    num_classes = int(conv.top.get("num_classes", 80))
    conv.glob["num_classes"] = num_classes
    backbone, strides = _backbone(conv)
    arch: Dict[str, Any] = {"model_type": "det", "algorithm": name, "Backbone": backbone}
    if meta.data.get("neck") is not None:
        arch["Neck"], strides = _neck(conv, strides)
    box_head = _cascade_head(conv, num_classes) if cascade else _bbox_head(conv, num_classes)
    arch["Head"] = {
        "name": "FasterRCNNHead",
        "rpn_head": _rpn_head(conv),
        "bbox_head": box_head,
        "feat_strides": strides,
    }
    loss = {  # the RPN's target settings and the box weights, which the loss terms need too
        "name": "CascadeRCNNLoss" if cascade else "FasterRCNNLoss",
        "rpn_target_assign": dict(arch["Head"]["rpn_head"].get("rpn_target_assign") or {}),
    }
    if cascade:
        stages = int(box_head.get("num_cascade_stages", len(CASCADE_BBOX_WEIGHTS)))
        loss["bbox_weight"] = [list(w) for w in box_head.get("bbox_weight", CASCADE_BBOX_WEIGHTS)][:stages]
        if box_head.get("stage_loss_weights") is not None:
            loss["stage_loss_weights"] = list(box_head["stage_loss_weights"])
    else:
        loss["bbox_weight"] = list(box_head.get("bbox_weight") or [10.0, 10.0, 5.0, 5.0])
    return arch, loss, _post_process(conv, num_classes)


def _backbone(conv: DetConverter) -> Tuple[Dict[str, Any], List[int]]:
    sec = conv.top.sub("ResNet")
    norm = conv.shared(sec, "norm_type", "bn")
    if norm == "sync_bn":
        conv.glob["use_sync_bn"] = True
        conv.report.note("ResNet.norm_type sync_bn: Global.use_sync_bn (every BatchNorm synchronised)")
    elif norm != "bn":
        raise ConfigError(f"{conv.path}: ResNet.norm_type {norm!r} is not supported (bn or sync_bn)")
    values = dict(RESNET_DEFAULTS)
    explicit = [k for k in RESNET_KEYS if k in sec]
    values.update({k: sec.get(k) for k in explicit})
    sec.finish()
    idx = values["return_idx"]
    idx = [idx] if isinstance(idx, int) else list(idx)
    return component(BACKBONES, "ResNet", values, explicit), [4 * 2**i for i in idx]


def _neck(conv: DetConverter, strides: List[int]) -> Tuple[Dict[str, Any], List[int]]:
    sec = conv.top.sub("FPN")
    values = dict(FPN_DEFAULTS)
    explicit = [k for k in FPN_KEYS if k in sec]
    values.update({k: sec.get(k) for k in explicit})
    if "out_channel" not in values:
        raise ConfigError(f"{conv.path}: FPN.out_channel is required (PaddleDetection has no default)")
    for key in ("in_channels", "spatial_scales"):
        if key in sec:
            sec.get(key)
            conv.report.note(
                f"FPN.{key}: taken from the backbone's outputs (as PaddleDetection's from_config)"
            )
    for key in ("norm_decay", "freeze_norm"):
        if key in sec and values.get("norm_type") is None:
            sec.get(key)  # only used with a norm
    sec.finish()
    values["spatial_scales"] = [1.0 / s for s in strides]
    extra = int(values["extra_stage"])
    levels = strides + [strides[-1] * 2**i for i in range(1, extra + 1)]
    return component(NECKS, "FPN", values, explicit + ["spatial_scales"]), levels


def _named_section(conv: DetConverter, value: Any, where: str, expected: str) -> Dict[str, Any]:
    """A part named by class (its top-level section) or given as ``{name, **kwargs}``."""
    name = value.get("name", expected) if isinstance(value, dict) else value
    if name != expected:
        raise ConfigError(f"{conv.path}: {where} {name!r} is not supported (ppdist has {expected})")
    out: Dict[str, Any] = {"name": expected}
    if expected in conv.top:
        section = conv.top.sub(expected)
        out.update({k: section.get(k) for k in list(section.data)})
    if isinstance(value, dict):
        out.update({k: v for k, v in value.items() if k != "name"})
    return out


def _rpn_head(conv: DetConverter) -> Dict[str, Any]:
    sec = conv.top.sub("RPNHead")
    out: Dict[str, Any] = {"name": "RPNHead"}
    out.update({k: sec.get(k) for k in RPN_KEYS if k in sec})
    if "in_channel" in sec:
        sec.get("in_channel")
        conv.report.note(
            "RPNHead.in_channel: taken from the neck's outputs (as PaddleDetection's from_config)"
        )
    sec.finish()
    return out


def _bbox_head(conv: DetConverter, num_classes: int) -> Dict[str, Any]:
    sec = conv.top.sub("BBoxHead")
    head = sec.get("head", "TwoFCHead")
    head_name = head.get("name") if isinstance(head, dict) else head
    expected = "Res5Head" if head_name == "Res5Head" else "TwoFCHead"  # C4 / FPN
    out: Dict[str, Any] = {"name": "BBoxHead", "head": _named_section(conv, head, "BBoxHead.head", expected)}
    out["head"].pop("in_channel", None)  # the RoI features' width: from the neck
    out["head"].pop("resolution", None)  # from roi_extractor, as PaddleDetection's from_config
    out.update({k: sec.get(k) for k in BBOX_HEAD_KEYS if k in sec})
    return _with_sampler(conv, sec, out, num_classes)


def _cascade_head(conv: DetConverter, num_classes: int) -> Dict[str, Any]:
    """``CascadeHead`` with ``CascadeTwoFCHead`` and its ``BBoxAssigner`` (``cascade_iou``)."""
    sec = conv.top.sub("CascadeHead")
    head = _named_section(conv, sec.get("head", "CascadeTwoFCHead"), "CascadeHead.head", "CascadeTwoFCHead")
    for key in ("in_channel", "resolution", "num_cascade_stage"):  # from the neck, the RoI size, the head
        head.pop(key, None)
    out: Dict[str, Any] = {"name": "CascadeHead", "head": head}
    out.update({k: sec.get(k) for k in CASCADE_HEAD_KEYS if k in sec})
    if "num_cascade_stages" not in out and "num_cascade_stages" in conv.top:
        out["num_cascade_stages"] = conv.top.get("num_cascade_stages")  # PaddleDetection's __shared__ key
    return _with_sampler(conv, sec, out, num_classes)


def _with_sampler(conv: DetConverter, sec: Keys, out: Dict[str, Any], num_classes: int) -> Dict[str, Any]:
    """A box head entry ``out`` (of section ``sec``) completed: its ``BBoxAssigner`` and the class
    count (PaddleDetection's ``__shared__`` num_classes), the keys it derives or ignores read."""
    assigner = _named_section(
        conv, sec.get("bbox_assigner", "BBoxAssigner"), f"{out['name']}.bbox_assigner", "BBoxAssigner"
    )
    assigner["num_classes"] = num_classes
    out["bbox_assigner"] = assigner
    out["num_classes"] = num_classes
    sec.get("num_classes")
    if "in_channel" in sec:
        sec.get("in_channel")
    sec.skip("bbox_loss", "the box loss is L1, as PaddleDetection's default")
    sec.finish()
    return out


def _post_process(conv: DetConverter, num_classes: int) -> Dict[str, Any]:
    sec = conv.top.sub("BBoxPostProcess")
    decode = _named_section(conv, sec.get("decode", "RCNNBox"), "BBoxPostProcess.decode", "RCNNBox")
    decode.pop("num_classes", None)
    nms = sec.get("nms", "MultiClassNMS")
    nms_out = _named_section(conv, nms, "BBoxPostProcess.nms", "MultiClassNMS")
    sec.get("num_classes")
    for key in ("export_onnx", "export_eb"):
        sec.expect(key, False, "Paddle's export paths; see tools/export_model.py")
    sec.finish()
    return {"name": "BBoxPostProcess", "num_classes": num_classes, "decode": decode, "nms": nms_out}
