"""Test helpers: a tiny CRNN config on synthetic digits and tool launchers (plain functions)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from typing import Any, Dict, Iterator, List, Optional

import yaml

from ppdist.config import load_config
from ppdist.engine.hooks.base import Hook

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
QUICKSTART = os.path.join(REPO, "configs", "rec", "quickstart_synth.yml")
EVAL_TRANSFORMS = [
    {"DecodeImage": {"img_mode": "BGR", "channel_first": False}},
    {"CTCLabelEncode": None},
    {"RecResizeImg": {"image_shape": [3, 32, 100]}},
    {"KeepKeys": {"keep_keys": ["image", "label", "length"]}},
]


def tiny_config(
    path: str,
    data_dir: str,
    save_dir: str,
    epochs: int = 4,
    num_train: int = 512,
    lr: float = 0.002,
    **global_extra,
) -> str:
    """A small, fast CRNN variant (MobileNetV3-small 0.35 + FC sequence encoder) on digits."""
    config = {
        "_BASE_": [QUICKSTART],
        "Global": dict(
            {
                "epoch_num": epochs,
                "save_model_dir": save_dir,
                "save_epoch_step": 1,
                "print_batch_step": 4,
                "eval_batch_step": [0, 1000000],
                "eval_batch_epoch": 2,
                "dist_timeout": 300,
                "plot_curves": False,  # drawn by the tests of curves and pictures only
                "eval_pictures": False,
                "synthetic_data": {
                    "kind": "rec",
                    "data_dir": data_dir,
                    "num_train": num_train,
                    "num_val": 51,
                    "seed": 1,
                    "charset": "0123456789",
                    "min_len": 3,
                    "max_len": 5,
                },
            },
            **global_extra,
        ),
        "Architecture": {
            "Backbone": {
                "name": "MobileNetV3",
                "model_name": "small",
                "scale": 0.35,
                "small_stride": [1, 2, 2, 2],
            },
            "Neck": {"name": "SequenceEncoder", "encoder_type": "fc", "hidden_size": 64},
        },
        "Optimizer": {"lr": {"name": "Cosine", "learning_rate": lr, "warmup_epoch": 0}},
        "Train": {
            "dataset": {
                "data_dir": data_dir,
                "label_file_list": [os.path.join(data_dir, "train.txt")],
                "transforms": EVAL_TRANSFORMS,
            },
            "loader": {"batch_size_per_card": 16, "num_workers": 1},
        },
        "Eval": {
            "dataset": {"data_dir": data_dir, "label_file_list": [os.path.join(data_dir, "val.txt")]},
            "loader": {"batch_size_per_card": 8, "num_workers": 0},
        },
    }
    with open(path, "w") as handle:
        yaml.safe_dump(config, handle)
    return path


def tiny_run_config(
    tmp_path: Any, data_dir: str, save: str = "out", overrides=(), **global_extra
) -> Dict[str, Any]:
    """The loaded ``tiny_config`` of 2 epochs for an in-process run (no workers, a log line every 5 steps)."""
    path = tiny_config(
        str(tmp_path / f"{save}.yml"), data_dir, str(tmp_path / save), epochs=2, **global_extra
    )
    overrides = [
        "Train.loader.num_workers=0",
        "Global.synthetic_data=null",
        "Global.print_batch_step=5",
    ] + list(overrides)
    return load_config(path, overrides)


def child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", "")})
    return env


# A subprocess's timeout is there to end a hang, not to bound work: 10x and more than any test's
# command takes on a slow 2-core machine with the other test worker busy.
HANG_TIMEOUT_S = 900


def run_tool(
    args: List[str], nproc: Optional[int] = None, timeout: int = HANG_TIMEOUT_S
) -> subprocess.CompletedProcess:
    """Run ``tools/<script> args`` directly (nproc None) or under ``torchrun --standalone``."""
    script = os.path.join(REPO, "tools", args[0])
    if nproc is None:
        cmd = [sys.executable, script] + args[1:]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            script,
        ] + args[1:]
    return subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout)


def check_ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nSTDOUT:\n{result.stdout[-4000:]}\nSTDERR:\n{result.stderr[-4000:]}"
    )
    return result


SEG_QUICKSTART = os.path.join(REPO, "configs", "seg", "quickstart_synth.yml")


def tiny_seg_config(
    path: str,
    data_dir: str,
    save_dir: str,
    max_iters: int = 150,
    num_train: int = 256,
    num_val: int = 37,
    model: str = "pp_liteseg",
    **global_extra,
) -> str:
    """A narrow PP-LiteSeg (STDC1 at base 16, thin decoder) on 64x64 synthetic shapes, 4 classes;
    ``model`` ``segformer`` / ``ocrnet`` swaps in a small model of that family (``TINY_SEG_MODELS``)."""
    min_kept = 8 * 64 * 64 // 16
    config = {
        "_BASE_": [SEG_QUICKSTART],
        "Global": dict(
            {
                "max_iters": max_iters,
                "save_model_dir": save_dir,
                "print_batch_step": 10,
                "eval_batch_step": [0, 1000000],
                "dist_timeout": 300,
                "plot_curves": False,  # drawn by the tests of curves and pictures only
                "eval_pictures": False,
                "num_classes": 4,
                "synthetic_data": {
                    "kind": "seg",
                    "data_dir": data_dir,
                    "num_train": num_train,
                    "num_val": num_val,
                    "seed": 3,
                    "image_size": 64,
                    "num_classes": 4,
                },
            },
            **global_extra,
        ),
        "Architecture": {
            "Backbone": {"name": "STDC1", "base": 16},
            "Head": {
                "name": "PPLiteSegHead",
                "arm_out_chs": [16, 16, 32],
                "seg_head_inter_chs": [16, 16, 16],
                "cm_out_ch": 32,
            },
        },
        "Loss": {"types": [{"name": "OhemCrossEntropyLoss", "thresh": 0.7, "min_kept": min_kept}] * 3},
        "Optimizer": {"lr": {"name": "PolynomialDecay", "learning_rate": 0.05, "warmup_iters": 20}},
        "Train": {
            "dataset": {
                "dataset_root": data_dir,
                "transforms": [
                    {"RandomPaddingCrop": {"crop_size": [64, 64]}},
                    {"RandomHorizontalFlip": {}},
                    {"Normalize": {}},
                ],
            },
            "loader": {"batch_size_per_card": 8, "num_workers": 1},
        },
        "Eval": {
            "dataset": {"dataset_root": data_dir},
            "loader": {"batch_size_per_card": 4, "num_workers": 0},
        },
    }
    family = TINY_SEG_MODELS[model]
    if family:  # the family's recipe as the base (its model keys), the tiny model, data and loss
        config["_BASE_"] = [family["base"]]
        config.update({key: family[key] for key in ("Architecture", "Loss", "PostProcess")})
        config["Train"]["dataset"].update(name="SegDataSet", train_path="train.txt")
        config["Eval"]["dataset"].update(name="SegDataSet", val_path="val.txt", transforms=EVAL_64)
    with open(path, "w") as handle:
        yaml.safe_dump(config, handle)
    return path


# The other PaddleSeg families on tiny_seg_config's data, based on their recipes: SegFormer-B0
# (fixed widths) with a narrow decoder, OCRNet on HRNet_W18_Small_V1 with a narrow OCR head;
# whole-image eval after a 64x64 Resize (a no-op on the data; exports use 64x64 example inputs).
EVAL_64 = [{"Resize": {"target_size": [64, 64]}}, {"Normalize": {}}]
TINY_SEG_MODELS: Dict[str, Dict[str, Any]] = {
    "pp_liteseg": {},
    "segformer": {
        "base": os.path.join(REPO, "configs", "seg", "segformer_b0_cityscapes_1024x1024_160k.yml"),
        "Architecture": {"Head": {"name": "SegFormerHead", "embedding_dim": 32}},
        "Loss": {"types": [{"name": "CrossEntropyLoss"}], "coef": [1]},
        "PostProcess": {"is_slide": False},
    },
    "ocrnet": {
        "base": os.path.join(REPO, "configs", "seg", "ocrnet_hrnetw18_cityscapes_1024x512_160k.yml"),
        "Architecture": {
            "Backbone": {"name": "HRNet_W18_Small_V1"},
            "Head": {"name": "OCRHead", "ocr_mid_channels": 32, "ocr_key_channels": 16},
        },
        "Loss": {"types": [{"name": "CrossEntropyLoss"}] * 2, "coef": [1, 0.4]},
        "PostProcess": {"is_slide": False},
    },
}


DET_QUICKSTART = os.path.join(REPO, "configs", "det", "quickstart_synth.yml")


def tiny_det_config(
    path: str,
    data_dir: str,
    save_dir: str,
    epochs: int = 8,
    num_train: int = 256,
    num_val: int = 37,
    image_size: int = 96,
    **global_extra,
) -> str:
    """A narrow PP-YOLOE (width 0.25, depth 0.33) on ``image_size`` squared synthetic shapes, 2 classes.

    Its learning rate, 0.002, learns in every run tried (2 processes, SyncBN, 64 px, 16 epochs:
    ap50 0.17-0.28, tests/integration/test_det_torchrun.py); the recipe's 0.01 is too much for this
    narrow model (96 px, 12 epochs, 1 process: 3 seeds of 4 learned nothing)."""
    config = {
        "_BASE_": [DET_QUICKSTART],
        "Global": dict(
            {
                "epoch_num": epochs,
                "save_model_dir": save_dir,
                "print_batch_step": 8,
                "eval_batch_epoch": epochs,
                "dist_timeout": 300,
                "plot_curves": False,  # drawn by the tests of curves and pictures only
                "eval_pictures": False,
                "num_classes": 2,
                "width_mult": 0.25,
                "depth_mult": 0.33,
                "synthetic_data": {
                    "kind": "det",
                    "data_dir": data_dir,
                    "num_train": num_train,
                    "num_val": num_val,
                    "seed": 5,
                    "image_size": image_size,
                    "num_classes": 2,
                    "max_objects": 3,
                },
            },
            **global_extra,
        ),
        "Loss": {"static_assigner_epoch": 4},
        "Optimizer": {
            "lr": {
                "name": "CosineDecay",
                "learning_rate": 0.002,
                "max_epochs": epochs + 2,
                "warmup_epoch": 1,
                "warmup_start_lr": 0.0,
            }
        },
        "Train": {
            "dataset": {
                "dataset_dir": data_dir,
                "transforms": [{"Decode": {}}, {"RandomFlip": {}}],
                "batch_transforms": [
                    {
                        "BatchRandomResize": {
                            "target_size": [image_size],
                            "random_size": True,
                            "random_interp": False,
                            "keep_ratio": False,
                        }
                    },
                    {"NormalizeImage": {}},
                    {"Permute": {}},
                    {"PadGT": {}},
                ],
            },
            "loader": {"batch_size_per_card": 8, "num_workers": 1},
        },
        "Eval": {
            "dataset": {
                "dataset_dir": data_dir,
                "transforms": [
                    {"Decode": {}},
                    {"Resize": {"target_size": [image_size, image_size], "keep_ratio": False, "interp": 2}},
                    {"NormalizeImage": {}},
                    {"Permute": {}},
                ],
            },
            "loader": {"batch_size_per_card": 4, "num_workers": 0},
        },
    }
    with open(path, "w") as handle:
        yaml.safe_dump(config, handle)
    return path


def tree_digest(root: str) -> str:
    """SHA-256 over every file's relative path and bytes under ``root`` (sorted walk)."""
    import hashlib

    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            digest.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as handle:
                digest.update(handle.read())
    return digest.hexdigest()


def paddle_fixture_dir(family: str) -> str:
    """tests/fixtures/paddle_<family>: a .pdparams, inputs and the original's outputs, with make_fixtures.py."""
    return os.path.join(REPO, "tests", "fixtures", f"paddle_{family}")


def paddle_fixture_script(family: str) -> Any:
    """The family's make_fixtures.py as a module (its settings and numpy weight recipes; it imports Paddle
    only when run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"paddle_{family}_fixtures", os.path.join(paddle_fixture_dir(family), "make_fixtures.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def paddle_fixture_arrays(family: str, name: str) -> Dict[str, Any]:
    """Every array of the fixture ``<name>.npz`` (inputs, the original's outputs, statistics)."""
    import numpy as np

    with np.load(os.path.join(paddle_fixture_dir(family), f"{name}.npz")) as data:
        return {key: data[key] for key in data.files}


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def ppdist_log_records(level: int = logging.INFO) -> Iterator[List[logging.LogRecord]]:
    """The records of the ``ppdist`` logger at ``level`` and above, by a handler of its own:
    independent of pytest's caplog, which misses them once ``setup_logger`` (called by
    ``build_trainer`` when nothing is configured) stops their propagation, and which pytest 9
    attaches to non-propagating loggers, so that toggling ``propagate`` counts them twice."""
    logger, collect = logging.getLogger("ppdist"), _Collect()
    previous = logger.level
    logger.addHandler(collect)
    logger.setLevel(level)
    try:
        yield collect.records
    finally:
        logger.removeHandler(collect)
        logger.setLevel(previous)


TABLE_QUICKSTART = os.path.join(REPO, "configs", "table", "quickstart_synth.yml")


def tiny_table_config(path: str, data_dir: str, save_dir: str, epochs: int = 2, size: int = 64) -> str:
    """A narrow SLANet (PPLCNet 0.25, CSPPAN 16, SLAHead 32 hidden, 40 tokens) on small synthetic
    tables (up to 3x3, made beforehand in ``data_dir``), images padded to ``size`` squared;
    an evaluation (accuracy and TEDS) every epoch, in-process loaders."""
    size_ops = {"ResizeTableImage": {"max_len": size}, "PaddingTableImage": {"size": [size, size]}}
    transforms = []
    for op in load_config(TABLE_QUICKSTART, ["Global.synthetic_data=null"])["Train"]["dataset"]["transforms"]:
        name = next(iter(op))
        transforms.append({name: size_ops[name]} if name in size_ops else op)
    config = {
        "_BASE_": [TABLE_QUICKSTART],
        "Global": {
            "epoch_num": epochs,
            "save_model_dir": save_dir,
            "print_batch_step": 2,
            "eval_batch_step": [0, 1000000],
            "eval_batch_epoch": 1,
            "max_text_length": 40,
            "dist_timeout": 300,
            "plot_curves": False,
            "eval_pictures": False,
            "synthetic_data": None,
        },
        "Architecture": {
            "Backbone": {"scale": 0.25},
            "Neck": {"out_channels": 16},
            "Head": {"hidden_size": 32, "max_text_length": 40},
        },
        "Optimizer": {
            "lr": {
                "name": "Piecewise",
                "decay_epochs": [1],
                "values": [0.002, 0.001],
                "learning_rate": 0.002,
                "warmup_epoch": 0,
            }
        },
        "Train": {
            "dataset": {
                "data_dir": data_dir,
                "label_file_list": [os.path.join(data_dir, "train.txt")],
                "transforms": transforms,
            },
            "loader": {"batch_size_per_card": 8, "num_workers": 0},
        },
        "Eval": {
            "dataset": {
                "data_dir": data_dir,
                "label_file_list": [os.path.join(data_dir, "val.txt")],
                "transforms": transforms,
            },
            "loader": {"batch_size_per_card": 4, "num_workers": 0},
        },
    }
    with open(path, "w") as handle:
        yaml.safe_dump(config, handle)
    return path


def multi_size_det_config(folder: Any, name: str, sizes: List[int], *overrides: str) -> Dict[str, Any]:
    """The loaded tiny detector of ``tiny_det_config`` (16 training images, made here) trained 3
    steps of 2 images at the multi-scale ``sizes`` (BatchRandomResize), in-process loading."""
    path = tiny_det_config(
        str(folder / f"{name}.yml"), str(folder / "data"), str(folder / name), num_train=16
    )
    return load_config(
        path,
        [
            f"Train.dataset.batch_transforms.0.BatchRandomResize.target_size={sizes}",
            "Train.loader.batch_size_per_card=2",
            "Train.loader.num_workers=0",
            "Global.max_iters=3",
            "Global.eval_during_train=false",
            *overrides,
        ],
    )


def spread_class_scores(model: Any) -> None:
    """An untrained detector's scoring layers spread, so that NMS and the proposal ranking have no
    near-ties: the class layers (PP-YOLOE's ``pred_cls``, Faster R-CNN's ``bbox_score``, Cascade
    R-CNN's ``bbox_score_stage<i>``) at
    Normal(0, 0.05) weights and Normal(0, 1) biases; Faster R-CNN's RPN objectness too."""
    import torch

    head = model.head
    if hasattr(head, "pred_cls"):
        layers = list(head.pred_cls)
    else:  # Faster R-CNN's one classifier or every Cascade R-CNN stage's
        layers = [m for name, m in head.bbox_head.named_children() if name.startswith("bbox_score")]
    if hasattr(head, "rpn_head"):
        layers.append(head.rpn_head.rpn_rois_score)
    for layer in layers:
        torch.nn.init.normal_(layer.weight, std=0.05)
        torch.nn.init.normal_(layer.bias, std=1.0)


class StopAfterStep(Hook):
    """Raises ``RuntimeError("killed")`` after global step ``at``: a run killed there."""

    def __init__(self, at: int) -> None:
        self.at = at

    def after_step(self) -> None:
        if self.trainer.position.global_step == self.at:
            raise RuntimeError("killed")
