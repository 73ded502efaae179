"""PaddleDetection's static-graph era configs (release/0.x-2.2 ``static/configs``: ``max_iters``,
``_READER_``, ``FPNRPNHead``, ``FPNRoIAlign``, ``num_classes`` counting the background) -> the same
config in PaddleDetection 2.x's format, which ``paddledetection.DetConverter`` then converts.

The Fleet-era multi-machine guide trains ``static/configs/faster_rcnn_r50_fpn_1x.yml``; this module
carries such a config over key by key, with the static classes' own defaults where the config
leaves a key out. A key it has no translation for is refused naming it (``ConfigError``); a key
whose static meaning ppdist (like PaddleDetection 2.x) does not reproduce is listed in the
conversion's unmapped keys with the reason, as every converter reports what it leaves out.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ppdist.config import merge_dicts
from ppdist.convert.configs.common import read_paddle_yaml
from ppdist.errors import ConfigError

READER_KEY = "_READER_"
STATIC_ONLY_KEYS = ("max_iters", READER_KEY, "snapshot_iter")
# the static classes' constructor defaults (facts of PaddleDetection release/2.2's static/ppdet)
RESNET_DEFAULTS = {
    "depth": 50,
    "freeze_at": 2,
    "norm_type": "affine_channel",
    "freeze_norm": True,
    "norm_decay": 0.0,
    "variant": "b",
    "feature_maps": [2, 3, 4, 5],
}
FPN_DEFAULTS = {"num_chan": 256, "min_level": 2, "max_level": 6, "has_extra_convs": False, "use_c5": True}
PROPOSAL_DEFAULTS = {"pre_nms_top_n": 6000, "post_nms_top_n": 1000, "nms_thresh": 0.5, "min_size": 0.1}
ROI_ALIGN_DEFAULTS = {
    "sampling_ratio": 0,
    "min_level": 2,
    "max_level": 5,
    "canconical_level": 4,
    "canonical_size": 224,
    "box_resolution": 7,
}
ASSIGNER_DEFAULTS = {
    "batch_size_per_im": 512,
    "fg_fraction": 0.25,
    "fg_thresh": 0.5,
    "bg_thresh_hi": 0.5,
    "bg_thresh_lo": 0.0,
    "bbox_reg_weights": [0.1, 0.1, 0.2, 0.2],
}
NMS_DEFAULTS = {"score_threshold": 0.05, "nms_top_k": -1, "keep_top_k": 100, "nms_threshold": 0.5}
# static reader transforms -> 2.x ones (keys translated in _transform)
TRANSFORMS = {
    "DecodeImage": "Decode",
    "RandomFlipImage": "RandomFlip",
    "NormalizeImage": "NormalizeImage",
    "ResizeImage": "Resize",
    "Permute": "Permute",
    "PadBatch": "PadBatch",
}


def is_static_det(data: Mapping[str, Any]) -> bool:
    """Whether a PaddleDetection mapping is in the static era's format."""
    return any(key in data for key in STATIC_ONLY_KEYS) and "epoch" not in data


class Section:
    """One static section read key by key; ``done`` refuses a key nobody read."""

    def __init__(
        self, data: Any, where: str, path: str, defaults: Optional[Mapping[str, Any]] = None
    ) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: {where} must be a mapping of keys, got {data!r}")
        self.data, self.where, self.path = dict(data), where, path
        self.defaults = dict(defaults or {})
        self.read: set = {"name"}

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return self.data.get(key, self.defaults.get(key))

    def ignore(self, *keys: str) -> None:
        """Keys whose value changes nothing in ppdist (feed, process-pool or naming settings)."""
        self.read.update(keys)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.read)
        if unknown:
            raise ConfigError(
                f"{self.path}: {self.where}.{unknown[0]} (static-era key) has no translation to "
                f"PaddleDetection 2.x's format in ppdist; remove it or write the config in 2.x's format"
            )


class StaticTranslator:
    """A static-era config (already merged with its ``_READER_`` file) -> 2.x's format."""

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        self.top = Section(data, "(top level)", path)
        self.path = path
        self.unmapped: List[str] = []

    def leave(self, key: str, value: Any, why: str) -> None:
        """A static key whose meaning is not reproduced: listed, with why."""
        self.unmapped.append(f"{key} (= {value!r}): {why}")

    def run(self) -> Dict[str, Any]:
        top = self.top
        arch = top["architecture"]
        if arch != "FasterRCNN":
            raise ConfigError(
                f"{self.path}: architecture {arch!r} of a static-era config: ppdist translates FasterRCNN "
                f"(the Fleet-era guide's model); write other models in PaddleDetection 2.x's format"
            )
        out: Dict[str, Any] = {"architecture": "FasterRCNN", "max_iters": int(top["max_iters"])}
        num_classes = int(top["num_classes"] if top["num_classes"] is not None else 81)
        out["num_classes"] = num_classes - 1  # static counts the background, 2.x does not
        for key in ("use_gpu", "log_iter", "save_dir", "weights", "metric"):
            if top[key] is not None:
                out[key] = top[key]
        out["snapshot_iter"] = int(top["snapshot_iter"] or 10000)
        if top["pretrain_weights"]:
            out["pretrain_weights"] = self.pretrain_weights(str(top["pretrain_weights"]))
        parts = Section(
            top["FasterRCNN"],
            "FasterRCNN",
            self.path,
            {
                "backbone": "ResNet",
                "rpn_head": "RPNHead",
                "roi_extractor": "RoIAlign",
                "bbox_head": "BBoxHead",
                "bbox_assigner": "BBoxAssigner",
                "fpn": None,
            },
        )
        expected = {
            "backbone": "ResNet",
            "fpn": "FPN",
            "rpn_head": "FPNRPNHead",
            "roi_extractor": "FPNRoIAlign",
            "bbox_head": "BBoxHead",
            "bbox_assigner": "BBoxAssigner",
        }
        for key, name in expected.items():
            if parts[key] != name:
                raise ConfigError(
                    f"{self.path}: FasterRCNN.{key}: {parts[key]!r}; ppdist translates the static FPN model "
                    f"({', '.join(f'{k}: {v}' for k, v in expected.items())})"
                )
        if parts["rpn_only"]:
            self.leave("FasterRCNN.rpn_only", True, "ppdist trains the whole detector")
        parts.done()
        out["FasterRCNN"] = {
            "backbone": "ResNet",
            "neck": "FPN",
            "rpn_head": "RPNHead",
            "bbox_head": "BBoxHead",
            "bbox_post_process": "BBoxPostProcess",
        }
        out["ResNet"] = self.resnet(Section(top["ResNet"], "ResNet", self.path, RESNET_DEFAULTS))
        fpn = Section(top["FPN"], "FPN", self.path, FPN_DEFAULTS)
        out["FPN"], levels = self.fpn(fpn)
        out["RPNHead"] = self.rpn_head(Section(top["FPNRPNHead"], "FPNRPNHead", self.path), levels)
        out["BBoxHead"], out["BBoxAssigner"], out["TwoFCHead"], out["BBoxPostProcess"] = self.bbox_head(top)
        out["LearningRate"], out["OptimizerBuilder"] = self.schedule(top)
        out.update(self.readers(top))
        top.done()
        return out

    # ------------------------------------------------------------------ model
    def pretrain_weights(self, value: str) -> str:
        """Static ImageNet weights were folders in a .tar; 2.x's are one .pdparams of the same name."""
        return value[: -len(".tar")] + ".pdparams" if value.endswith(".tar") else value

    def resnet(self, sec: Section) -> Dict[str, Any]:
        feature_maps = [int(i) for i in sec["feature_maps"]]
        freeze_at = int(sec["freeze_at"])
        norm = sec["norm_type"]
        out = {
            "depth": int(sec["depth"]),
            "variant": sec["variant"],
            "norm_type": "bn" if norm == "affine_channel" else norm,
            "freeze_norm": True if norm == "affine_channel" else bool(sec["freeze_norm"]),
            "norm_decay": float(sec["norm_decay"]),
            # static: stages up to res<freeze_at> stop the gradient (res2 and the stem from 2 on);
            # 2.x: index 0 is res2, and the stem is frozen with it
            "freeze_at": freeze_at - 2 if freeze_at >= 2 else -1,
            "return_idx": [i - 2 for i in feature_maps],
            "num_stages": max(feature_maps) - 1,
        }
        for key in ("dcn_v2_stages", "nonlocal_stages", "gcb_stages"):
            if sec[key]:
                raise ConfigError(f"{self.path}: ResNet.{key} {sec[key]!r}: not supported by ppdist's ResNet")
        if sec["lr_mult_list"] is not None:
            out["lr_mult_list"] = list(sec["lr_mult_list"])
        sec.ignore("weight_prefix_name")
        sec.done()
        return out

    def fpn(self, sec: Section) -> Tuple[Dict[str, Any], Tuple[int, int]]:
        min_level, max_level = int(sec["min_level"]), int(sec["max_level"])
        scales = sec["spatial_scale"] or [1.0 / 2**level for level in range(5, min_level - 1, -1)]
        out = {
            "out_channel": int(sec["num_chan"]),
            "spatial_scales": sorted((float(s) for s in scales), reverse=True),  # 2.x: finest first
            "has_extra_convs": bool(sec["has_extra_convs"]),
            "extra_stage": max_level - 5,
            "use_c5": bool(sec["use_c5"]),
        }
        if sec["norm_type"]:
            out["norm_type"] = sec["norm_type"]
        sec.ignore("norm_decay", "freeze_norm", "reverse_out")
        sec.done()
        return out, (min_level, max_level)

    def rpn_head(self, sec: Section, levels: Tuple[int, int]) -> Dict[str, Any]:
        min_level, max_level = int(sec["min_level"] or levels[0]), int(sec["max_level"] or levels[1])
        start = float(sec["anchor_start_size"] or 32)
        anchors = Section(
            sec["anchor_generator"],
            "FPNRPNHead.anchor_generator",
            self.path,
            {"aspect_ratios": [0.5, 1.0, 2.0], "variance": [1.0, 1.0, 1.0, 1.0]},
        )
        if [float(v) for v in anchors["variance"]] != [1.0, 1.0, 1.0, 1.0]:
            raise ConfigError(
                f"{self.path}: FPNRPNHead.anchor_generator.variance must be [1, 1, 1, 1] in ppdist"
            )
        anchors.ignore("anchor_sizes", "stride")  # FPN: anchor_start_size x 2^k per level, stride 2^level
        levels_range = range(min_level, max_level + 1)
        anchor_generator = {
            "aspect_ratios": [float(a) for a in anchors["aspect_ratios"]],
            "anchor_sizes": [[start * 2 ** (level - min_level)] for level in levels_range],
            "strides": [2**level for level in levels_range],
        }
        anchors.done()
        assign = Section(
            sec["rpn_target_assign"],
            "FPNRPNHead.rpn_target_assign",
            self.path,
            {
                "rpn_batch_size_per_im": 256,
                "rpn_straddle_thresh": 0.0,
                "rpn_fg_fraction": 0.5,
                "rpn_positive_overlap": 0.7,
                "rpn_negative_overlap": 0.3,
                "use_random": True,
            },
        )
        target = {
            key[len("rpn_") :] if key.startswith("rpn_") else key: assign[key]
            for key in (
                "rpn_batch_size_per_im",
                "rpn_fg_fraction",
                "rpn_positive_overlap",
                "rpn_negative_overlap",
                "use_random",
            )
        }
        if float(assign["rpn_straddle_thresh"]) >= 0:
            self.leave(
                "FPNRPNHead.rpn_target_assign.rpn_straddle_thresh",
                assign["rpn_straddle_thresh"],
                "anchors crossing the image border take part in the RPN targets (PaddleDetection 2.x)",
            )
        assign.done()
        proposals = {}
        for name, defaults in (
            ("train_proposal", {"pre_nms_top_n": 12000, "post_nms_top_n": 2000}),
            ("test_proposal", {}),
        ):
            prop = Section(sec[name], f"FPNRPNHead.{name}", self.path, {**PROPOSAL_DEFAULTS, **defaults})
            if float(prop["eta"] if prop["eta"] is not None else 1.0) != 1.0:
                raise ConfigError(
                    f"{self.path}: FPNRPNHead.{name}.eta must be 1 (adaptive NMS is not supported)"
                )
            # static FPN: post_nms_top_n per level, then the best post_nms_top_n of the image
            proposals[name] = {
                key: prop[key] for key in ("min_size", "nms_thresh", "pre_nms_top_n", "post_nms_top_n")
            }
            proposals[name]["topk_after_collect"] = True
            prop.done()
        sec.ignore("num_chan", "num_classes")  # FPN's width; the RPN's one objectness class
        sec.done()
        return {"anchor_generator": anchor_generator, "rpn_target_assign": target, **proposals}

    def bbox_head(
        self, top: Section
    ) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        roi = Section(top["FPNRoIAlign"], "FPNRoIAlign", self.path, ROI_ALIGN_DEFAULTS)
        extractor = {
            "resolution": int(roi["box_resolution"]),
            "sampling_ratio": int(roi["sampling_ratio"]),
            "aligned": False,
            "canconical_level": int(roi["canconical_level"]),
            "canonical_size": int(roi["canonical_size"]),
            "start_level": 0,
            "end_level": int(roi["max_level"]) - int(roi["min_level"]),
        }
        roi.ignore("mask_resolution")
        roi.done()
        head = Section(top["BBoxHead"], "BBoxHead", self.path, {"head": "TwoFCHead"})
        if head["head"] != "TwoFCHead":
            raise ConfigError(f"{self.path}: BBoxHead.head {head['head']!r}: ppdist translates TwoFCHead")
        nms = Section(head["nms"], "BBoxHead.nms", self.path, NMS_DEFAULTS)
        post = {
            "decode": "RCNNBox",
            "nms": {
                "name": "MultiClassNMS",
                **{key: nms[key] for key in ("keep_top_k", "score_threshold", "nms_threshold", "nms_top_k")},
            },
        }
        nms.ignore("normalized", "nms_eta", "background_label")
        nms.done()
        coder = Section(
            head["box_coder"], "BBoxHead.box_coder", self.path, {"prior_box_var": [0.1, 0.1, 0.2, 0.2]}
        )
        prior = [float(v) for v in coder["prior_box_var"]]
        coder.ignore("code_type", "box_normalized", "axis")
        coder.done()
        post["decode"] = {"name": "RCNNBox", "prior_box_var": [1.0 / v for v in prior]}
        self.leave(
            "BBoxHead.bbox_loss",
            head["bbox_loss"] or "SmoothL1Loss",
            "the box loss is PaddleDetection 2.x's L1 on the sampled foreground RoIs",
        )
        head.ignore("num_classes")  # the top-level num_classes counts
        head.done()
        assigner = Section(top["BBoxAssigner"], "BBoxAssigner", self.path, ASSIGNER_DEFAULTS)
        if float(assigner["bg_thresh_lo"]) != 0.0:
            raise ConfigError(
                f"{self.path}: BBoxAssigner.bg_thresh_lo {assigner['bg_thresh_lo']}: ppdist "
                f"(as PaddleDetection 2.x) takes every RoI under bg_thresh as background; use 0"
            )
        weights = [float(v) for v in assigner["bbox_reg_weights"]]
        assign_out = {
            "batch_size_per_im": int(assigner["batch_size_per_im"]),
            "fg_fraction": float(assigner["fg_fraction"]),
            "fg_thresh": float(assigner["fg_thresh"]),
            "bg_thresh": float(assigner["bg_thresh_hi"]),
            "use_random": bool(
                assigner["shuffle_before_sample"] if assigner["shuffle_before_sample"] is not None else True
            ),
        }
        assigner.ignore("num_classes")
        assigner.done()
        two_fc = Section(top["TwoFCHead"], "TwoFCHead", self.path, {"mlp_dim": 1024})
        fc = {"out_channel": int(two_fc["mlp_dim"])}
        two_fc.done()
        bbox_head = {
            "head": "TwoFCHead",
            "roi_extractor": extractor,
            "bbox_assigner": "BBoxAssigner",
            "bbox_weight": [1.0 / w for w in weights],
        }
        return bbox_head, assign_out, fc, post

    # ------------------------------------------------------------------ schedule
    def schedule(self, top: Section) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        lr = Section(top["LearningRate"], "LearningRate", self.path, {"base_lr": 0.01})
        schedulers = []
        for i, entry in enumerate(lr["schedulers"] or []):
            sched = Section(entry, f"LearningRate.schedulers[{i}]", self.path)
            if sched["name"] == "PiecewiseDecay":
                # static milestones are iterations: kept as such (decay_iters via the converter)
                schedulers.append(
                    {
                        "name": "PiecewiseDecay",
                        "milestones": list(sched["milestones"]),
                        **{k: sched[k] for k in ("gamma", "values") if sched[k] is not None},
                    }
                )
            elif sched["name"] == "LinearWarmup":
                schedulers.append(
                    {
                        "name": "LinearWarmup",
                        "steps": int(sched["steps"] or 500),
                        "start_factor": float(
                            sched["start_factor"] if sched["start_factor"] is not None else 1.0 / 3
                        ),
                    }
                )
            else:
                raise ConfigError(
                    f"{self.path}: LearningRate.schedulers[{i}] {sched['name']!r}: ppdist "
                    f"translates PiecewiseDecay and LinearWarmup of static-era configs"
                )
            sched.done()
        out_lr = {"base_lr": float(lr["base_lr"]), "schedulers": schedulers}
        lr.done()
        builder = top["OptimizerBuilder"]
        return out_lr, builder if builder is not None else {}

    # ------------------------------------------------------------------ readers
    def readers(self, top: Section) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        top.ignore(READER_KEY)
        for kind, dataset_key in (
            ("TrainReader", "TrainDataset"),
            ("EvalReader", "EvalDataset"),
            ("TestReader", "TestDataset"),
        ):
            if top[kind] is None:
                continue
            reader = Section(top[kind], kind, self.path)
            if reader["dataset"] is not None:
                out[dataset_key] = dict(reader["dataset"])
            new: Dict[str, Any] = {}
            for key in ("sample_transforms", "batch_transforms"):
                if reader[key] is not None:
                    new[key] = [
                        self.transform(entry, f"{kind}.{key}[{i}]") for i, entry in enumerate(reader[key])
                    ]
            for key in ("batch_size", "shuffle", "drop_last"):
                if reader[key] is not None:
                    new[key] = reader[key]
            reader.ignore("inputs_def", "worker_num", "use_process", "drop_empty", "bufsize", "memsize")
            reader.done()
            out[kind] = new
        return out

    def transform(self, entry: Any, where: str) -> Dict[str, Any]:
        if not isinstance(entry, Mapping) or "name" not in entry:
            raise ConfigError(f"{self.path}: {where} must be a !Transform mapping, got {entry!r}")
        name = entry["name"]
        if name not in TRANSFORMS:
            raise ConfigError(
                f"{self.path}: {where} {name!r}: ppdist translates {', '.join(TRANSFORMS)} "
                f"of static-era readers"
            )
        sec = Section(entry, where, self.path)
        args: Dict[str, Any] = {}
        if name == "RandomFlipImage":
            args["prob"] = float(sec["prob"] if sec["prob"] is not None else 0.5)
            sec.ignore("is_normalized", "is_mask_flip")
        elif name == "NormalizeImage":
            args = {k: sec[k] for k in ("mean", "std", "is_scale") if sec[k] is not None}
            sec.ignore("is_channel_first")
        elif name == "ResizeImage":
            target, max_size = sec["target_size"], sec["max_size"]
            if isinstance(target, list):
                raise ConfigError(f"{self.path}: {where}.target_size {target!r}: ppdist translates one size")
            args = {
                "target_size": [int(target), int(max_size or target)],
                "keep_ratio": bool(max_size),
                "interp": int(sec["interp"] if sec["interp"] is not None else 1),
            }
            sec.ignore("use_cv2")
        elif name == "PadBatch":
            args["pad_to_stride"] = int(sec["pad_to_stride"] or 0)
            sec.ignore("use_padded_im_info", "pad_gt")
        else:  # DecodeImage (2.x decodes to RGB), Permute (to CHW)
            sec.ignore("to_rgb", "with_mixup", "with_cutmix", "to_bgr", "channel_first")
        sec.done()
        return {TRANSFORMS[name]: args}


def load_static_reader(data: Dict[str, Any], path: str) -> Dict[str, Any]:
    """``data`` over its ``_READER_`` file (relative to ``path``): the config's own reader keys win."""
    reader = data.get(READER_KEY)
    if not reader:
        return data
    reader_path = reader if os.path.isabs(reader) else os.path.join(os.path.dirname(path), reader)
    if not os.path.isfile(reader_path):
        raise ConfigError(f"{path}: {READER_KEY} file not found: {reader} (resolved to {reader_path})")
    return merge_dicts(read_paddle_yaml(reader_path), data)


def translate_static(data: Dict[str, Any], path: str) -> Tuple[Dict[str, Any], List[str]]:
    """The 2.x-format mapping of a static-era config, and the static keys it leaves out (with why)."""
    translator = StaticTranslator(load_static_reader(data, path), path)
    return translator.run(), translator.unmapped
