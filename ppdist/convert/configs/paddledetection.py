"""PaddleDetection (PP-YOLOE) config -> ppdist config.

Reads a PaddleDetection YAML with its ``_BASE_`` chain (PaddleDetection's rules: bases are
relative to the file naming them, later bases override earlier ones, the file overrides its
bases; mappings merge recursively, lists and scalars are replaced) and writes the ppdist
sections. Keys PaddleDetection would take from constructor defaults get PaddleDetection's
defaults, so the ppdist run matches even where ppdist's own defaults differ.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ppdist.config import BASE_KEY, STAGE_PRETRAINED_KEY, merge_dicts
from ppdist.convert.configs.common import (
    PADDLEDET,
    Conversion,
    Keys,
    Report,
    base_paths,
    check_cycle,
    component,
    fix_path,
    is_url,
    read_paddle_yaml,
    same_value,
)
from ppdist.convert.configs.transforms import convert_det_transforms
from ppdist.errors import ConfigError
from ppdist.registry import BACKBONES, HEADS, LOSSES, NECKS, POSTPROCESSES

ARCHITECTURES = ("YOLOv3", "PPYOLOE")
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
NMS_DEFAULTS = {"score_threshold": 0.05, "nms_top_k": -1, "keep_top_k": 100, "nms_threshold": 0.5}
COCO_DEFAULT_FIELDS = ["image", "gt_bbox", "gt_class", "is_crowd"]


# --------------------------------------------------------------------------- loading
def load_det_yaml(path: str, _seen: Sequence[str] = ()) -> Dict[str, Any]:
    """``path`` merged over its ``_BASE_`` files with PaddleDetection's rules."""
    real = check_cycle(path, _seen, BASE_KEY)
    data = read_paddle_yaml(path)
    merged: Dict[str, Any] = {}
    for base in base_paths(path, data.pop(BASE_KEY, None), BASE_KEY):
        merged = merge_dicts(merged, load_det_yaml(base, tuple(_seen) + (real,)))
    return merge_dicts(merged, data)


def convert_det(path: str) -> Conversion:
    """The ppdist config equivalent to the PaddleDetection config ``path``."""
    return convert_det_mapping(load_det_yaml(path), path)


def convert_det_mapping(data: Dict[str, Any], path: str) -> Conversion:
    """The ppdist config equivalent to ``data``, the PaddleDetection config ``path`` already read
    with its bases (and changed, e.g. by ``tools/train.py -o key=value`` in PaddleDetection's keys)."""
    report = Report()
    top = Keys(data, "", report)
    converter = _DetConverter(top, report, path)
    config = converter.run()
    return Conversion(PADDLEDET, path, config, report.unmapped, report.notes)


# --------------------------------------------------------------------------- the converter
class _DetConverter:
    def __init__(self, top: Keys, report: Report, path: str) -> None:
        self.top = top
        self.report = report
        self.path = path
        self.glob: Dict[str, Any] = {}

    def run(self) -> Dict[str, Any]:
        arch, loss, post = self.architecture()
        config = {
            "Global": self.glob,
            "Architecture": arch,
            "Loss": loss,
            "Optimizer": self.optimizer(),
            "PostProcess": post,
            "Metric": self.metric(),
        }
        train, evaluation = self.data()
        config["Train"] = train
        if evaluation is not None:
            config["Eval"] = evaluation
        self.global_keys()
        self.pretrain_weights(arch)
        self.top.finish("no ppdist equivalent")
        return config

    # ------------------------------------------------------------------ run-wide keys
    def global_keys(self) -> None:
        top, glob, report = self.top, self.glob, self.report
        if "use_gpu" in top:
            glob["use_gpu"] = bool(top.get("use_gpu"))
        epoch = top.get("epoch")
        if epoch is None:
            raise ConfigError(f"{self.path}: missing required key 'epoch' (the number of training epochs)")
        glob["epoch_num"] = int(epoch)
        stem = os.path.splitext(os.path.basename(self.path))[0]
        glob["save_model_dir"] = os.path.join(top.get("save_dir", "output"), stem)
        report.note(
            f"Global.save_model_dir: {glob['save_model_dir']} (save_dir/<config name>, where the config's "
            f"'weights' key expects PaddleDetection's checkpoints)"
        )
        snapshot = int(top.get("snapshot_epoch", 1))
        glob["save_epoch_step"] = snapshot
        glob["eval_batch_epoch"] = snapshot
        report.note(
            f"snapshot_epoch {snapshot}: Global.save_epoch_step and Global.eval_batch_epoch (ppdist evaluates "
            f"whenever an Eval section exists, like PaddleDetection's --eval)"
        )
        log_iter = int(top.get("log_iter", 20))
        glob["print_batch_step"] = log_iter
        glob["log_smooth_window"] = log_iter
        top.skip(
            "weights",
            "PaddleDetection's default weights of eval/infer/export; ppdist tools take "
            "-o Global.checkpoints=PATH (a ppdist checkpoint or a .pdparams)",
        )
        self.ema()
        norm = top.get("norm_type", "bn")
        if norm == "sync_bn":
            glob["use_sync_bn"] = True
        elif norm != "bn":
            report.unmapped_key(
                "norm_type", "ppdist models use BatchNorm (sync_bn: Global.use_sync_bn)", norm
            )
        if "find_unused_parameters" in top:
            glob["find_unused_parameters"] = bool(top.get("find_unused_parameters"))
        if top.get("use_vdl"):
            glob["use_tensorboard"] = True
        if "log_ranks" in top:
            glob["log_ranks"] = top.get("log_ranks")
        if top.get("amp"):
            glob["use_amp"] = True
        if "amp_level" in top:
            glob["amp_level"] = top.get("amp_level")
        if "init_loss_scaling" in top:
            glob["scale_loss"] = float(top.get("init_loss_scaling"))
        top.skip("custom_black_list", "Paddle AMP op list kept in float32; torch.autocast uses its own list")
        for key in ("use_xpu", "use_npu", "use_mlu", "use_gcu"):
            top.skip(key, "ppdist runs on CUDA or CPU")
        for key in ("print_flops", "print_params"):
            top.skip(key, "no FLOPs/parameter printing in ppdist (count parameters with tools/benchmark.py)")
        top.skip("export", "PaddleDetection export options; see tools/export_model.py")
        top.skip("vdl_log_dir", "TensorBoard writes to save_model_dir/tensorboard")

    def pretrain_weights(self, arch: Dict[str, Any]) -> None:
        """``pretrain_weights``: backbone weights (a file named after the backbone, e.g.
        ``CSPResNetb_s_pretrained.pdparams``) -> ``Architecture.Backbone.pretrained``; a whole
        detector (e.g. ``ppyoloe_crn_s_obj365_pretrained.pdparams``) -> ``Global.pretrained_model``."""
        value = self.top.get("pretrain_weights")
        if not value:
            return
        backbone = os.path.basename(str(value)).lower().startswith(arch["Backbone"]["name"].lower())
        key = f"Architecture.Backbone.{STAGE_PRETRAINED_KEY}" if backbone else "Global.pretrained_model"
        what = "backbone weights" if backbone else "whole-model weights"
        if is_url(value):
            self.report.unmapped_key(
                "pretrain_weights",
                f"a URL ({what}); ppdist does not download weights: download "
                f"it and give the local .pdparams path with -o {key}=PATH",
                value,
            )
            return
        path = fix_path(value, self.path, "pretrain_weights", self.report)
        if backbone:
            arch["Backbone"][STAGE_PRETRAINED_KEY] = path
        else:
            self.glob["pretrained_model"] = path
        self.report.note(f"pretrain_weights: {what} by the file name -> {key}")

    def ema(self) -> None:
        top, glob = self.top, self.glob
        if not top.get("use_ema"):
            for key in ("ema_decay", "ema_decay_type", "cycle_epoch", "ema_black_list", "ema_filter_no_grad"):
                top.skip(key, "use_ema is off")
            return
        glob["use_ema"] = True
        glob["ema_decay"] = float(top.get("ema_decay", 0.9998))
        kind = top.get("ema_decay_type", "threshold")
        if kind in ("threshold", "normal", "exponential"):
            glob["ema_decay_type"] = "constant" if kind == "normal" else kind
        else:
            self.report.unmapped_key(
                "ema_decay_type", "ppdist has 'threshold', 'normal' and 'exponential'", kind
            )
        top.expect("cycle_epoch", -1, "no periodic EMA reset in ppdist")
        black = top.get("ema_black_list")
        if black and list(black) != ["proj_conv.weight"]:
            self.report.unmapped_key(
                "ema_black_list", "ppdist's EMA averages every floating-point tensor", black
            )
        elif black:
            self.report.note(
                "ema_black_list [proj_conv.weight]: ppdist keeps the DFL projection as a constant "
                "buffer, so the EMA never changes it (same effect)"
            )
        if top.get("ema_filter_no_grad"):
            self.report.note(
                "ema_filter_no_grad: ppdist's EMA always copies the tensors training never changes "
                "(frozen stages, freeze_norm) instead of averaging them (same effect)"
            )

    # ------------------------------------------------------------------ model
    def shared(self, section: Keys, key: str, default: Any) -> Any:
        """A ``__shared__`` key: the section's value, else the top-level one, else the default."""
        if key in section:
            return section.get(key)
        if key in self.top:
            return self.top.get(key)
        return default

    def architecture(self) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        top, report = self.top, self.report
        name = top.get("architecture")
        if name not in ARCHITECTURES:
            raise ConfigError(
                f"{self.path}: architecture {name!r} is not supported: ppdist converts PP-YOLOE "
                f"(architecture {' or '.join(ARCHITECTURES)} with CSPResNet, CustomCSPPAN and "
                f"PPYOLOEHead)"
            )
        meta = top.sub(name)
        parts = {"backbone": "CSPResNet", "neck": "CustomCSPPAN", "yolo_head": "PPYOLOEHead"}
        for key, expected in parts.items():
            value = meta.get(key)
            if value != expected:
                raise ConfigError(
                    f"{self.path}: {name}.{key} {value!r} is not supported: ppdist converts PP-YOLOE "
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

        width = {k: self.shared(top.sub(k), "width_mult", 1.0) for k in ("CSPResNet", "CustomCSPPAN")}
        depth = {k: self.shared(top.sub(k), "depth_mult", 1.0) for k in ("CSPResNet", "CustomCSPPAN")}
        top.get("width_mult")
        top.get("depth_mult")
        per_component = len(set(width.values())) > 1 or len(set(depth.values())) > 1
        if not per_component:
            self.glob["width_mult"] = float(width["CSPResNet"])
            self.glob["depth_mult"] = float(depth["CSPResNet"])
        backbone = self.backbone(BACKBONES, per_component)
        neck = self.neck(NECKS, per_component)
        head, loss, post = self.head(HEADS, LOSSES, POSTPROCESSES)
        arch = {"model_type": "det", "algorithm": "PPYOLOE", "Backbone": backbone, "Neck": neck, "Head": head}
        return arch, loss, post

    def section_values(
        self, sec: Any, defaults: Dict[str, Any], per_component: bool
    ) -> Tuple[Dict[str, Any], List[str]]:
        """Paddle's defaults overridden by the section's keys (the explicit ones listed), plus the
        width/depth multipliers when backbone and neck have their own."""
        values = dict(defaults)
        explicit = [k for k in defaults if k in sec]
        values.update({k: sec.get(k) for k in explicit})
        if per_component:
            values.update(
                width_mult=self.shared(sec, "width_mult", 1.0), depth_mult=self.shared(sec, "depth_mult", 1.0)
            )
            explicit += ["width_mult", "depth_mult"]
        sec.get("width_mult")  # read (as global values) either way: not "unconverted"
        sec.get("depth_mult")
        return values, explicit

    def backbone(self, registry: Any, per_component: bool) -> Dict[str, Any]:
        sec = self.top.sub("CSPResNet")
        values, explicit = self.section_values(sec, CSPRESNET_DEFAULTS, per_component)
        sec.expect("depth_wise", False, "ppdist's CSPResNet has no depth-wise variant")
        sec.expect("trt", False, "TensorRT-specific activation")
        sec.expect("use_checkpoint", False, "no gradient checkpointing in ppdist")
        for key in FREEZE_KEYS:  # fine-tuning settings a user adds (ppdist.modeling.freezing)
            if key in sec:
                values[key] = sec.get(key)
                explicit.append(key)
        sec.finish()
        return component(registry, "CSPResNet", values, explicit)

    def neck(self, registry: Any, per_component: bool) -> Dict[str, Any]:
        sec = self.top.sub("CustomCSPPAN")
        values, explicit = self.section_values(sec, CSPPAN_DEFAULTS, per_component)
        if "in_channels" in sec:
            sec.get("in_channels")
            self.report.note(
                "CustomCSPPAN.in_channels: taken from the backbone's outputs (as PaddleDetection's "
                "from_config does)"
            )
        norm = self.shared(sec, "norm_type", "bn")
        sec.get("norm_type")
        if norm not in ("bn", "sync_bn"):
            self.report.unmapped_key("CustomCSPPAN.norm_type", "ppdist's neck uses BatchNorm", norm)
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

    def head(
        self, heads: Any, losses: Any, posts: Any
    ) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        top, report = self.top, self.report
        sec = top.sub("PPYOLOEHead")
        num_classes = self.shared(sec, "num_classes", 80)
        top.get("num_classes")
        sec.get("num_classes")
        self.glob["num_classes"] = int(num_classes)
        values = dict(HEAD_DEFAULTS)
        explicit = [k for k in HEAD_DEFAULTS if k in sec]
        values.update({k: sec.get(k) for k in explicit})
        eval_size = self.shared(sec, "eval_size", None)
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
                "PPYOLOEHead.in_channels: taken from the neck's outputs (as PaddleDetection's "
                "from_config does)"
            )
        head = component(heads, "PPYOLOEHead", values, explicit)

        loss_values = dict(LOSS_DEFAULTS)
        loss_explicit = [k for k in LOSS_DEFAULTS if k in sec]
        loss_values.update({k: sec.get(k) for k in loss_explicit})
        loss_values["reg_max"] = values["reg_max"]
        loss_values["static_assigner"] = self.assigner(sec, "static_assigner", "ATSSAssigner", ATSS_DEFAULTS)
        loss_values["assigner"] = self.assigner(sec, "assigner", "TaskAlignedAssigner", TAL_DEFAULTS)
        loss = component(losses, "PPYOLOELoss", loss_values, loss_explicit + ["static_assigner", "assigner"])
        post = self.nms(sec, posts)
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

    def assigner(self, head: Keys, key: str, expected: str, defaults: Dict[str, Any]) -> Dict[str, Any]:
        """``static_assigner``/``assigner``: a class name (its top-level section) or ``{name, **kwargs}``."""
        value = head.get(key, expected)
        name = value.get("name") if isinstance(value, dict) else value
        if name != expected:
            raise ConfigError(
                f"{self.path}: PPYOLOEHead.{key} {name!r} is not supported (ppdist has {expected})"
            )
        section = self.top.sub(expected) if expected in self.top else Keys({}, expected, self.report)
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
                self.report.unmapped_key(
                    f"PPYOLOEHead.{key}.{k}", f"no such option in ppdist's {expected}", v
                )
        return out

    def nms(self, head: Keys, registry: Any) -> Dict[str, Any]:
        value = head.get("nms", "MultiClassNMS")
        name = value.get("name") if isinstance(value, dict) else value
        if name != "MultiClassNMS":
            raise ConfigError(
                f"{self.path}: PPYOLOEHead.nms {name!r} is not supported (ppdist has MultiClassNMS)"
            )
        section = (
            self.top.sub("MultiClassNMS")
            if "MultiClassNMS" in self.top
            else Keys({}, "MultiClassNMS", self.report)
        )
        params = {k: section.get(k) for k in list(section.data)}
        if isinstance(value, dict):
            params.update({k: v for k, v in value.items() if k != "name"})
        values = dict(NMS_DEFAULTS)
        explicit = []
        for key, val in params.items():
            if key in NMS_DEFAULTS:
                values[key] = val
                explicit.append(key)
            elif (key, val) in (
                ("normalized", True),
                ("nms_eta", 1.0),
                ("return_index", False),
                ("return_rois_num", True),
                ("trt", False),
                ("background_label", -1),
            ):
                continue
            else:
                self.report.unmapped_key(
                    f"PPYOLOEHead.nms.{key}",
                    "no such option in ppdist's MultiClassNMS (hard NMS, normalized boxes)",
                    val,
                )
        return component(registry, "MultiClassNMS", values, explicit)

    def metric(self) -> Dict[str, Any]:
        top = self.top
        metric = top.get("metric", "COCO")
        if metric != "COCO":
            raise ConfigError(f"{self.path}: metric {metric!r} is not supported (ppdist has COCO)")
        out: Dict[str, Any] = {"name": "COCOMetric", "main_indicator": "ap"}
        if top.get("classwise"):
            out["classwise"] = True
        if top.get("output_eval"):
            out["output_dir"] = top.get("output_eval")
        if top.get("bias"):
            out["bias"] = 1
        top.expect("IouType", "bbox", "ppdist evaluates boxes only")
        top.expect("save_prediction_only", False, "ppdist always computes the metric")
        return out

    # ------------------------------------------------------------------ optimizer
    def optimizer(self) -> Dict[str, Any]:
        top, report = self.top, self.report
        builder = top.sub("OptimizerBuilder")
        opt_cfg = Keys(
            builder.get("optimizer", {"type": "Momentum", "momentum": 0.9}),
            "OptimizerBuilder.optimizer",
            report,
        )
        kind = opt_cfg.get("type")
        out: Dict[str, Any]
        if kind in ("Momentum", "SGD"):
            out = {"name": kind}
            if kind == "Momentum":
                out["momentum"] = float(opt_cfg.get("momentum", 0.9))
            if opt_cfg.get("use_nesterov"):
                out["use_nesterov"] = True
        elif kind in ("Adam", "AdamW"):
            out = {"name": kind}
            for key in ("beta1", "beta2", "epsilon"):
                if key in opt_cfg:
                    out[key] = float(opt_cfg.get(key))
            if kind == "AdamW":
                out["weight_decay"] = float(opt_cfg.get("weight_decay", 0.01))
        else:
            raise ConfigError(
                f"{self.path}: OptimizerBuilder.optimizer.type {kind!r} is not supported "
                f"(Momentum, SGD, Adam, AdamW)"
            )
        opt_cfg.skip("param_groups", "per-group optimizer settings are not supported")
        opt_cfg.expect("multi_precision", False, "master weights are handled by AMP's GradScaler")
        opt_cfg.finish()
        reg = builder.get("regularizer", {"type": "L2", "factor": 0.0001})
        if reg and reg != "None":
            reg_keys = Keys(reg, "OptimizerBuilder.regularizer", report)
            if kind == "AdamW":
                report.unmapped_key(
                    "OptimizerBuilder.regularizer",
                    "ignored for AdamW by PaddleDetection too (AdamW uses its weight_decay)",
                    reg,
                    show_value=True,
                )
                reg_keys.used.update(reg_keys.data)
            elif reg_keys.get("type") != "L2":
                report.unmapped_key(
                    "OptimizerBuilder.regularizer.type", "ppdist has L2 only", reg_keys.get("type")
                )
            else:
                out["regularizer"] = {"name": "L2", "factor": float(reg_keys.get("factor", 0.0001))}
            reg_keys.finish()
        if builder.get("clip_grad_by_norm") is not None:
            out["clip_norm_global"] = float(builder.get("clip_grad_by_norm"))
        builder.skip("clip_grad_by_value", "ppdist clips by norm only")
        builder.finish()
        out["lr"] = self.learning_rate()
        return out

    def learning_rate(self) -> Dict[str, Any]:
        sec = self.top.sub("LearningRate")
        base_lr = float(sec.get("base_lr", 0.01))
        schedulers = sec.get("schedulers")
        if schedulers is None:
            schedulers = [{"name": "PiecewiseDecay"}, {"name": "LinearWarmup"}]
        sec.finish()
        if not isinstance(schedulers, list) or not schedulers:
            raise ConfigError(f"{self.path}: LearningRate.schedulers must be a non-empty list")
        decay = Keys(schedulers[0], "LearningRate.schedulers[0]", self.report)
        name = decay.get("name")
        use_warmup = decay.get("use_warmup", True)
        if name == "CosineDecay":
            out: Dict[str, Any] = {
                "name": "CosineDecay",
                "learning_rate": base_lr,
                "max_epochs": int(decay.get("max_epochs", 1000)),
            }
            decay.expect("min_lr_ratio", 0.0, "ppdist's CosineDecay anneals to 0")
            decay.expect("last_plateau_epochs", 0, "no final plateau in ppdist's CosineDecay")
        elif name == "PiecewiseDecay":
            milestones = list(decay.get("milestones", [8, 11]))
            values = decay.get("values")
            if values is None:
                gamma = decay.get("gamma", [0.1, 0.01])
                gammas = gamma if isinstance(gamma, list) else [gamma / 10**i for i in range(len(milestones))]
                values = [base_lr] + [base_lr * g for g in gammas]
            out = {"name": "Piecewise", "decay_epochs": milestones, "values": [float(v) for v in values]}
        else:
            raise ConfigError(
                f"{self.path}: LearningRate scheduler {name!r} is not supported (CosineDecay, "
                f"PiecewiseDecay, with LinearWarmup)"
            )
        decay.finish()
        if use_warmup and len(schedulers) > 1:
            self.warmup(Keys(schedulers[1], "LearningRate.schedulers[1]", self.report), out, base_lr)
        for i, extra in enumerate(schedulers[2:], start=2):
            self.report.unmapped_key(
                f"LearningRate.schedulers[{i}]",
                "PaddleDetection uses only the first two schedulers (decay, warmup)",
                extra,
            )
        return out

    def warmup(self, sec: Keys, out: Dict[str, Any], base_lr: float) -> None:
        name = sec.get("name")
        if name != "LinearWarmup":
            self.report.unmapped_key(
                "LearningRate.schedulers[1]",
                "ppdist warms up linearly only (LinearWarmup); no warmup converted",
                sec.data,
            )
            sec.used.update(sec.data)
            return
        epochs = sec.get("epochs")
        steps = int(sec.get("steps", 500))
        start = float(sec.get("start_factor", 1.0 / 3))
        sec.expect("epochs_first", True, "warmup epochs always take priority over steps in ppdist")
        sec.finish()
        if out["name"] == "Piecewise":
            if epochs is None and steps:
                self.report.unmapped_key(
                    "LearningRate.schedulers[1].steps",
                    "ppdist's Piecewise warms up over whole epochs only (use epochs)",
                    steps,
                )
            elif epochs:
                out["warmup_epoch"] = epochs
                out["boundaries_after_warmup"] = False  # PaddleDetection's milestones count from step 0
                if start:
                    self.report.unmapped_key(
                        "LearningRate.schedulers[1].start_factor", "ppdist's Piecewise warms up from 0", start
                    )
            return
        if epochs is not None:
            out["warmup_epoch"] = epochs
        elif steps:
            out["warmup_iters"] = steps
        out["warmup_start_lr"] = base_lr * start

    # ------------------------------------------------------------------ data
    def data(self) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
        top = self.top
        workers = top.get("worker_num")
        if workers is None:
            workers = 2
            self.report.note("worker_num is not set: Train/Eval.loader.num_workers 2")
        train = self.section("Train", top.sub("TrainDataset"), top.sub("TrainReader"), int(workers))
        evaluation = None
        if "EvalDataset" in top:
            evaluation = self.section("Eval", top.sub("EvalDataset"), top.sub("EvalReader"), int(workers))
        else:
            top.skip("EvalReader", "no EvalDataset")
        self.test_reader()
        return train, evaluation

    def section(self, name: str, dataset: Keys, reader: Keys, workers: int) -> Dict[str, Any]:
        kind = dataset.get("name")
        if kind != "COCODataSet":
            raise ConfigError(
                f"{self.path}: {dataset.path}.name {kind!r} is not supported (ppdist has COCODataSet)"
            )
        ds: Dict[str, Any] = {"name": "COCODataSet"}
        for key in ("dataset_dir", "image_dir", "anno_path"):
            value = dataset.get(key) or ""
            if key == "dataset_dir":
                value = fix_path(value, self.path, f"{dataset.path}.{key}", self.report)
            ds[key] = value
        for key, default in (("allow_empty", False), ("empty_ratio", 1.0), ("load_crowd", False)):
            if key in dataset:
                value = dataset.get(key)
                if not same_value(value, default):
                    ds[key] = value
        fields = dataset.get("data_fields")
        if fields is not None and not set(fields) <= set(COCO_DEFAULT_FIELDS):
            self.report.unmapped_key(
                f"{dataset.path}.data_fields", "ppdist loads image, gt_bbox, gt_class and is_crowd", fields
            )
        dataset.expect("sample_num", -1, "ppdist uses the whole annotation file")
        dataset.expect("repeat", 1, "no dataset repetition in ppdist")
        dataset.finish()
        ds["transforms"] = convert_det_transforms(
            reader.get("sample_transforms") or [], f"{reader.path}.sample_transforms", self.report
        )
        batch = reader.get("batch_transforms") or []
        if batch:
            ds["batch_transforms"] = convert_det_transforms(
                batch, f"{reader.path}.batch_transforms", self.report
            )
        training = name == "Train"
        loader: Dict[str, Any] = {"batch_size_per_card": int(reader.get("batch_size", 1))}
        if training:
            loader["shuffle"] = bool(reader.get("shuffle", True))
            loader["drop_last"] = bool(reader.get("drop_last", True))
        else:
            loader["shuffle"] = False
            loader["drop_last"] = False
            for key in ("shuffle", "drop_last"):
                if key in reader:
                    reader.get(key)
                    self.report.note(
                        f"{reader.path}.{key}: ignored, as by PaddleDetection's evaluation (a plain "
                        f"BatchSampler over every image)"
                    )
        loader["num_workers"] = workers
        if "use_shared_memory" in reader:
            loader["use_shared_memory"] = bool(reader.get("use_shared_memory"))
        reader.expect("collate_batch", True, "ppdist always collates (PadGT pads the boxes)")
        reader.expect("drop_empty", True, "empty images follow COCODataSet.allow_empty")
        reader.get("num_classes")
        for key in ("mixup_epoch", "cutmix_epoch", "mosaic_epoch", "inputs_def"):
            reader.skip(key, "not supported by ppdist's loader")
        reader.finish()
        return {"dataset": ds, "loader": loader}

    def test_reader(self) -> None:
        top = self.top
        if "TestReader" in top:
            test = top.sub("TestReader")
            evaluation = top.data.get("EvalReader") or {}
            same = same_value(test.data.get("sample_transforms"), evaluation.get("sample_transforms"))
            test.used.update(test.data)
            why = "tools/infer.py and export use Eval.dataset.transforms" + (
                " (the same ops here)" if same else " (they differ here: check Eval's)"
            )
            self.report.unmapped_key("TestReader", why, show_value=False)
        top.skip("TestDataset", "tools/infer.py reads images from -o Global.infer_img=PATH")
