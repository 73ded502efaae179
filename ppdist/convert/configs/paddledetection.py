"""PaddleDetection config -> ppdist config (the model sections of each family: ``det_<family>.py``).

Reads a PaddleDetection YAML with its ``_BASE_`` chain (PaddleDetection's rules: bases are
relative to the file naming them, later bases override earlier ones, the file overrides its
bases; mappings merge recursively, lists and scalars are replaced) and writes the ppdist
sections. Keys PaddleDetection would take from constructor defaults get PaddleDetection's
defaults, so the ppdist run matches even where ppdist's own defaults differ.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

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
from ppdist.convert.configs.det_faster_rcnn import convert_faster_rcnn
from ppdist.convert.configs.det_ppyoloe import convert_ppyoloe
from ppdist.convert.configs.det_schedule import convert_det_optimizer
from ppdist.convert.configs.det_static import is_static_det, translate_static
from ppdist.convert.configs.transforms import convert_det_transforms
from ppdist.errors import ConfigError

# architecture name -> the converter of that family's model sections (Architecture, Loss, PostProcess)
FAMILIES: Dict[
    str, Callable[["DetConverter", str], Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]]
] = {
    "YOLOv3": convert_ppyoloe,
    "PPYOLOE": convert_ppyoloe,
    "FasterRCNN": convert_faster_rcnn,
    "CascadeRCNN": convert_faster_rcnn,
}
# PaddleDetection constructor defaults of the components ppdist implements (facts of its API).
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
    if is_static_det(data):  # the static-graph era's format (the Fleet-era guide's configs)
        data, left_out = translate_static(data, path)
        report.note(
            "a static-era config (max_iters, _READER_): translated to PaddleDetection 2.x's format first"
        )
        report.unmapped.extend(left_out)
    top = Keys(data, "", report)
    converter = DetConverter(top, report, path)
    config = converter.run()
    return Conversion(PADDLEDET, path, config, report.unmapped, report.notes)


# --------------------------------------------------------------------------- the converter
class DetConverter:
    """A PaddleDetection config -> ppdist sections: the run-wide keys, schedule, readers and metric
    here; the model sections by the family of ``architecture`` (``FAMILIES``)."""

    def __init__(self, top: Keys, report: Report, path: str) -> None:
        self.top = top
        self.report = report
        self.path = path
        self.glob: Dict[str, Any] = {}
        # other file-name starts of the family's ImageNet backbone weights (ResNeXt101_... for ResNet)
        self.backbone_file_prefixes: Tuple[str, ...] = ()

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
        if "max_iters" in top:  # a static-era config: iterations, snapshots every snapshot_iter
            glob["max_iters"] = int(top.get("max_iters"))
            snapshot_iter = int(top.get("snapshot_iter"))
            glob["save_iter_step"] = snapshot_iter
            glob["eval_batch_step"] = [0, snapshot_iter]
            report.note(
                f"max_iters {glob['max_iters']}, snapshot_iter {snapshot_iter}: Global.max_iters, "
                f"Global.save_iter_step and Global.eval_batch_step (evaluated at each snapshot, as --eval)"
            )
        else:
            epoch = top.get("epoch")
            if epoch is None:
                raise ConfigError(
                    f"{self.path}: missing required key 'epoch' (the number of training epochs)"
                )
            glob["epoch_num"] = int(epoch)
        stem = os.path.splitext(os.path.basename(self.path))[0]
        glob["save_model_dir"] = os.path.join(top.get("save_dir", "output"), stem)
        report.note(
            f"Global.save_model_dir: {glob['save_model_dir']} (save_dir/<config name>, where the config's "
            f"'weights' key expects PaddleDetection's checkpoints)"
        )
        if "max_iters" not in top:
            snapshot = int(top.get("snapshot_epoch", 1))
            glob["save_epoch_step"] = snapshot
            glob["eval_batch_epoch"] = snapshot
            report.note(
                f"snapshot_epoch {snapshot}: Global.save_epoch_step and Global.eval_batch_epoch (ppdist "
                f"evaluates whenever an Eval section exists, like PaddleDetection's --eval)"
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
        prefixes = (arch["Backbone"]["name"].lower(),) + self.backbone_file_prefixes
        backbone = os.path.basename(str(value)).lower().startswith(prefixes)
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
        """``(Architecture, Loss, PostProcess)`` by the config's ``architecture``: each family's
        model sections are converted by its own module (``FAMILIES``)."""
        name = self.top.get("architecture")
        if name not in FAMILIES:
            raise ConfigError(
                f"{self.path}: architecture {name!r} is not supported: ppdist converts "
                f"{', '.join(FAMILIES)} (PP-YOLOE: CSPResNet, CustomCSPPAN, PPYOLOEHead; Faster R-CNN: "
                f"ResNet, FPN, RPNHead, BBoxHead; Cascade R-CNN: CascadeHead)"
            )
        return FAMILIES[name](self, name)

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
        return convert_det_optimizer(self.top, self.report, self.path)

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
        if training and not any("PadGT" in entry for entry in ds.get("batch_transforms", [])):
            # PaddleDetection collates each image's boxes as a list; ppdist's losses take them padded
            ds.setdefault("batch_transforms", []).append({"PadGT": {}})
            self.report.note(
                f"{reader.path}.batch_transforms: PadGT appended (pads each batch's boxes to its "
                "largest count, as PaddleDetection's list of boxes per image), so any batch size trains"
            )
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
