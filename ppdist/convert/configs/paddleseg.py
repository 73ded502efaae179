"""PaddleSeg (PP-LiteSeg, SegFormer, OCRNet) config -> ppdist config.

Reads a PaddleSeg YAML with its ``_base_`` chain (PaddleSeg's rules: ``_base_`` is a path or a
list relative to the file; the file merges over each base in turn, so the file and earlier bases
win; mappings merge recursively unless the child sets ``_inherited_: False``; lists and scalars
are replaced) and writes the ppdist sections.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple

from ppdist.convert.configs.common import (
    PADDLESEG,
    Conversion,
    Keys,
    Report,
    base_paths,
    check_cycle,
    component,
    fix_path,
    is_url,
    read_paddle_yaml,
)
from ppdist.convert.configs.seg_models import convert_seg_model
from ppdist.convert.configs.transforms import convert_seg_transforms
from ppdist.errors import ConfigError
from ppdist.registry import LOSSES

SEG_BASE_KEY = "_base_"
INHERIT_KEY = "_inherited_"
# Class attributes of PaddleSeg's data sets that its builder copies into the model and losses.
DATASETS = {
    "Cityscapes": {"name": "CityscapesDataSet", "num_classes": 19, "ignore_index": 255},
    "Dataset": {"name": "SegDataSet"},
}
# PaddleSeg / Paddle constructor defaults of the components ppdist implements.
LOSS_DEFAULTS = {
    "CrossEntropyLoss": {"weight": None, "top_k_percent_pixels": 1.0, "avg_non_ignore": True},
    "OhemCrossEntropyLoss": {"thresh": 0.7, "min_kept": 10000, "weight": None},
}
POLY_DEFAULTS = {"end_lr": 0.0001, "power": 1.0}  # paddle.optimizer.lr.PolynomialDecay
TEST_CONFIG_KEYS = (
    "aug_eval",
    "scales",
    "flip_horizontal",
    "flip_vertical",
    "is_slide",
    "crop_size",
    "stride",
)


# --------------------------------------------------------------------------- loading
def merge_seg_dicts(child: Dict[str, Any], base: Dict[str, Any]) -> Dict[str, Any]:
    """PaddleSeg's merge: ``child`` over ``base``; ``_inherited_: False`` drops the base mapping."""
    child = dict(child)
    if not child.pop(INHERIT_KEY, True):
        return _strip_inherit(child)
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_seg_dicts(value, out[key])
        else:
            out[key] = _strip_inherit(value)
    return out


def _strip_inherit(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_inherit(v) for k, v in value.items() if k != INHERIT_KEY}
    return value


def load_seg_yaml(path: str, _seen: Sequence[str] = ()) -> Dict[str, Any]:
    """``path`` merged over its ``_base_`` files with PaddleSeg's rules."""
    real = check_cycle(path, _seen, SEG_BASE_KEY)
    data = read_paddle_yaml(path)
    for base in base_paths(path, data.pop(SEG_BASE_KEY, None), SEG_BASE_KEY):
        data = merge_seg_dicts(data, load_seg_yaml(base, tuple(_seen) + (real,)))
    return _strip_inherit(data)


def convert_seg(path: str) -> Conversion:
    """The ppdist config equivalent to the PaddleSeg config ``path``."""
    return convert_seg_mapping(load_seg_yaml(path), path)


def convert_seg_mapping(data: Dict[str, Any], path: str) -> Conversion:
    """The ppdist config equivalent to ``data``, the PaddleSeg config ``path`` already read with its
    bases (and changed, e.g. by ``tools/train.py --iters N --opts key=value`` in PaddleSeg's keys)."""
    report = Report()
    top = Keys(data, "", report)
    config = _SegConverter(top, report, path).run()
    return Conversion(PADDLESEG, path, config, report.unmapped, report.notes)


def _parts(raw: Any) -> str:
    """`` of A + B`` for a MixedLoss entry (the losses it mixes), else ``""``."""
    losses = raw.get("losses") if isinstance(raw, dict) else None
    if not isinstance(losses, list):
        return ""
    names = [str(item.get("type")) if isinstance(item, dict) else repr(item) for item in losses]
    return f" of {' + '.join(names)}"


# --------------------------------------------------------------------------- the converter
class _SegConverter:
    def __init__(self, top: Keys, report: Report, path: str) -> None:
        self.top = top
        self.report = report
        self.path = path
        self.glob: Dict[str, Any] = {}

    def require(self, key: str) -> Any:
        value = self.top.get(key)
        if value is None:
            raise ConfigError(
                f"{self.path}: missing required key '{key}' (PaddleSeg needs batch_size, iters, "
                f"train_dataset, optimizer, lr_scheduler, loss and model)"
            )
        return value

    def run(self) -> Dict[str, Any]:
        self.require("iters")
        train, num_classes, ignore_index = self.dataset("train_dataset", "Train")
        self.glob.update(num_classes=num_classes, ignore_index=ignore_index)
        evaluation = None
        if self.top.get("val_dataset") is not None:
            evaluation, _, _ = self.dataset("val_dataset", "Eval")
        config: Dict[str, Any] = {
            "Global": self.glob,
            "Architecture": self.model(),
            "Loss": self.loss(),
            "Optimizer": self.optimizer(),
            "PostProcess": self.test_config(),
            "Metric": {"name": "SegMetric", "main_indicator": "miou"},
            "Train": train,
        }
        if evaluation is not None:
            config["Eval"] = evaluation
        self.global_keys()
        self.top.skip("export", "the export tool takes the Eval transforms")
        self.top.skip("test_dataset", "no test split in ppdist; evaluate with the Eval section")
        self.top.skip("distill_loss", "no distillation in ppdist")
        self.top.expect("to_static_training", False, "no dynamic-to-static in ppdist (see Global.compile)")
        self.top.finish()
        return config

    def global_keys(self) -> None:
        glob, report = self.glob, self.report
        glob.update(
            use_gpu=True,
            max_iters=int(self.top.get("iters")),
            print_batch_step=10,
            log_smooth_window=10,
            eval_batch_step=[0, 1000],
            save_iter_step=1000,
            save_epoch_step=100,
            use_sync_bn=True,
            cal_metric_during_train=False,
            keep_checkpoint_max=5,
        )
        stem = os.path.splitext(os.path.basename(self.path))[0]
        glob["save_model_dir"] = os.path.join("output", stem)
        report.note(
            "PaddleSeg's command-line defaults are written to Global: --device gpu (use_gpu), "
            "--log_iters 10 (print_batch_step), --save_interval 1000 with --do_eval (eval_batch_step "
            "[0, 1000], save_iter_step 1000; iter_epoch_N checkpoints every 100 epochs), "
            "--keep_checkpoint_max 5 (keep_checkpoint_max), --save_dir output (save_model_dir "
            "output/<config name>); SyncBN on several GPUs (use_sync_bn)"
        )

    # ------------------------------------------------------------------ data
    def dataset(self, key: str, section: str) -> Tuple[Dict[str, Any], Optional[int], int]:
        sec = self.top.sub(key)
        if key == "train_dataset" and not sec.data:
            raise ConfigError(f"{self.path}: missing required key 'train_dataset'")
        kind = sec.get("type")
        if kind not in DATASETS:
            raise ConfigError(
                f"{self.path}: {key}.type {kind!r} is not supported (ppdist has {', '.join(DATASETS)})"
            )
        spec = DATASETS[kind]
        ds: Dict[str, Any] = {"name": spec["name"]}
        ds["dataset_root"] = fix_path(sec.get("dataset_root"), self.path, f"{key}.dataset_root", self.report)
        default_mode = "train" if section == "Train" else "val"
        mode = str(sec.get("mode", default_mode)).lower()
        num_classes = spec.get("num_classes")
        ignore_index = spec.get("ignore_index", 255)
        if kind == "Cityscapes":
            if mode != default_mode:
                ds["split"] = mode
        else:
            num_classes = sec.get("num_classes")
            if num_classes is None:
                raise ConfigError(f"{self.path}: {key}.num_classes is required for type Dataset")
            ignore_index = int(sec.get("ignore_index", 255))
            list_key = {"train": "train_path", "val": "val_path"}.get(mode)
            if list_key is None:
                raise ConfigError(
                    f"{self.path}: {key}.mode {mode!r} is not supported for type Dataset (train or val)"
                )
            path_value = sec.get(list_key)
            if path_value is None:
                raise ConfigError(f"{self.path}: {key}.{list_key} is required with mode {mode}")
            ds["train_path" if section == "Train" else "val_path"] = path_value
            other = "val_path" if list_key == "train_path" else "train_path"
            sec.get(other)  # the other split's list: not used by this section
            sec.skip("test_path", "no test split in ppdist")
            if "separator" in sec and sec.get("separator") != " ":
                ds["separator"] = sec.get("separator")
            if "img_channels" in sec and sec.get("img_channels") != 3:
                ds["img_channels"] = sec.get("img_channels")
        sec.expect("edge", False, "no edge labels in ppdist")
        ds["transforms"] = convert_seg_transforms(
            sec.get("transforms") or [], f"{key}.transforms", self.report
        )
        sec.finish()
        if section == "Train":
            batch = int(self.require("batch_size"))
            loader = {"batch_size_per_card": batch, "shuffle": True, "drop_last": True, "num_workers": 4}
            self.report.note(
                "Train.loader: batch_size per GPU, shuffle and drop_last as PaddleSeg's sampler; "
                "num_workers 4 (PaddleSeg's --num_workers flag defaults to 0)"
            )
        else:
            loader = {"batch_size_per_card": 1, "shuffle": False, "drop_last": False, "num_workers": 2}
            self.report.note("Eval.loader: one image per batch, as PaddleSeg's evaluation; num_workers 2")
        return {"dataset": ds, "loader": loader}, num_classes, ignore_index

    # ------------------------------------------------------------------ model
    def model(self) -> Dict[str, Any]:
        arch, pretrained = convert_seg_model(
            self.top.sub("model"), self.path, self.glob.get("num_classes"), self.report
        )
        if pretrained:
            if is_url(pretrained):
                self.report.unmapped_key(
                    "model.pretrained",
                    "a URL; ppdist does not download weights: download "
                    "it and give the local .pdparams with -o Global.pretrained_model=PATH",
                    pretrained,
                )
            else:
                self.glob["pretrained_model"] = fix_path(
                    pretrained, self.path, "model.pretrained", self.report
                )
        return arch

    # ------------------------------------------------------------------ loss / optimizer / eval
    def loss(self) -> Dict[str, Any]:
        sec = Keys(self.require("loss"), "loss", self.report)
        types = sec.get("types")
        coef = sec.get("coef")
        if not isinstance(types, list) or not types or not isinstance(coef, list):
            raise ConfigError(f"{self.path}: loss needs 'types' (a list) and 'coef' (a list)")
        entries = []
        for i, raw in enumerate(types):
            item = Keys(raw, f"loss.types[{i}]", self.report)
            kind = item.get("type")
            if kind not in LOSS_DEFAULTS:
                raise ConfigError(
                    f"{self.path}: loss.types[{i}]: loss type {kind!r}{_parts(raw)} is not supported "
                    f"(ppdist has {', '.join(LOSS_DEFAULTS)})"
                )
            values = dict(LOSS_DEFAULTS[kind])
            explicit = [k for k in values if k in item]
            values.update({k: item.get(k) for k in explicit})
            if "ignore_index" in item and item.get("ignore_index") != self.glob.get("ignore_index"):
                raise ConfigError(
                    f"{self.path}: loss.types[{i}].ignore_index differs from the data set's "
                    f"({self.glob.get('ignore_index')}), which PaddleSeg rejects too"
                )
            item.expect("data_format", "NCHW", "ppdist runs NCHW")
            item.finish()
            entries.append(
                component(LOSSES, kind, {k: v for k, v in values.items() if v is not None}, explicit)
            )
        sec.finish()
        return {"name": "MultiOutputLoss", "types": entries, "coef": list(coef)}

    def optimizer(self) -> Dict[str, Any]:
        sec = Keys(self.require("optimizer"), "optimizer", self.report)
        kind = sec.get("type")
        kind = {"sgd": "SGD", "adam": "Adam"}.get(kind, kind)
        if kind == "SGD" and "momentum" in sec:
            kind = "Momentum"
        out: Dict[str, Any] = {"name": kind}
        decay = sec.get("weight_decay")
        if kind in ("SGD", "Momentum"):
            if kind == "Momentum":
                out["momentum"] = float(sec.get("momentum", 0.9))
            if sec.get("use_nesterov"):
                out["use_nesterov"] = True
            if decay is not None:
                out["weight_decay"] = float(decay)
        elif kind in ("Adam", "AdamW"):
            for key in ("beta1", "beta2", "epsilon"):
                if key in sec:
                    out[key] = float(sec.get(key))
            if kind == "AdamW":
                out["weight_decay"] = float(0.01 if decay is None else decay)
                self.report.note(
                    "Optimizer AdamW: decoupled weight decay on every parameter, norms and biases "
                    "included, as PaddleSeg's AdamW (Paddle's AdamW without apply_decay_param_fun)"
                )
            elif decay is not None:
                out["regularizer"] = {"name": "L2", "factor": float(decay)}
            sec.expect("lazy_mode", False, "no lazy (sparse) Adam in ppdist")
        else:
            raise ConfigError(
                f"{self.path}: optimizer type {kind!r} is not supported (SGD, Momentum, Adam, AdamW)"
            )
        clip = sec.get("grad_clip_cfg")
        if clip:
            name = clip.get("name")
            if name == "ClipGradByGlobalNorm":
                out["clip_norm_global"] = float(clip.get("clip_norm"))
            elif name == "ClipGradByNorm":
                out["clip_norm"] = float(clip.get("clip_norm"))
            else:
                self.report.unmapped_key("optimizer.grad_clip_cfg", "ppdist clips by norm only", clip)
        sec.skip("custom_cfg", "per-parameter-group lr_mult / weight_decay_mult are not supported")
        sec.finish()
        out["lr"] = self.lr_scheduler()
        return out

    def lr_scheduler(self) -> Dict[str, Any]:
        if self.top.get("lr_scheduler") is None and isinstance(self.top.get("learning_rate"), dict):
            return self.legacy_learning_rate()
        sec = Keys(self.require("lr_scheduler"), "lr_scheduler", self.report)
        kind = sec.get("type")
        if kind != "PolynomialDecay":
            raise ConfigError(f"{self.path}: lr_scheduler type {kind!r} is not supported (PolynomialDecay)")
        out: Dict[str, Any] = {"name": "PolynomialDecay", "learning_rate": float(sec.get("learning_rate"))}
        for key, default in POLY_DEFAULTS.items():
            out[key] = float(sec.get(key, default))
        if sec.get("decay_steps") is not None:
            out["decay_steps"] = int(sec.get("decay_steps"))
        sec.expect("cycle", False, "no cyclic polynomial decay in ppdist")
        if "warmup_iters" in sec:
            out["warmup_iters"] = int(sec.get("warmup_iters"))
            start = sec.get("warmup_start_lr")
            if start is None:
                raise ConfigError(
                    f"{self.path}: lr_scheduler.warmup_iters needs warmup_start_lr (as in PaddleSeg)"
                )
            out["warmup_start_lr"] = float(start)
        sec.finish()
        return out

    def legacy_learning_rate(self) -> Dict[str, Any]:
        """PaddleSeg 2.0's ``learning_rate: {value, decay: {type: poly, power, end_lr}}``."""
        sec = self.top.sub("learning_rate")
        decay = sec.sub("decay")
        if decay.get("type", "poly") != "poly":
            raise ConfigError(
                f"{self.path}: learning_rate.decay type {decay.get('type')!r} is not supported (poly)"
            )
        out = {
            "name": "PolynomialDecay",
            "learning_rate": float(sec.get("value")),
            "end_lr": float(decay.get("end_lr", 0.0)),
            "power": float(decay.get("power", 0.9)),
        }
        decay.finish()
        sec.finish()
        return out

    def test_config(self) -> Dict[str, Any]:
        sec = self.top.sub("test_config")
        out: Dict[str, Any] = {"name": "SegPostProcess"}
        for key in TEST_CONFIG_KEYS:
            if key in sec:
                out[key] = sec.get(key)
        sec.finish("no such evaluation option in ppdist's SegPostProcess")
        return out
