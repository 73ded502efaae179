"""A small Faster R-CNN trains through ppdist's trainer: PaddleDetection's configs' model parts
(ResNet + FPN + FasterRCNNHead with BBoxAssigner) and FasterRCNNLoss on the synthetic det shapes;
its RPN and box classification losses fall, and evaluation (BBoxPostProcess + COCO metric) scores
the detections, the same in one process and in two (tools/eval.py under torchrun, gloo)."""

import json
import math
import os

import pytest
from ppdist_testing import check_ok, run_tool

from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.hooks.base import Hook
from ppdist.engine.setup import build_trainer
from ppdist.registry import SYNTHETIC_DATA

CONFIG = os.path.join(os.path.dirname(__file__), "..", "fixtures", "faster_rcnn", "tiny_train.yml")


class RecordLosses(Hook):
    """Every step's loss terms (read on the host: a test)."""

    name = "record_losses"

    def __init__(self) -> None:
        self.values = []

    def after_step(self) -> None:
        self.values.append({k: float(v) for k, v in self.trainer.last_step.values.items()})


@pytest.mark.slow
def test_a_small_faster_rcnn_learns_and_is_evaluated(tmp_path):
    data = str(tmp_path / "data")
    SYNTHETIC_DATA.get("det")(data, num_train=64, num_val=8, seed=3, image_size=64, num_classes=4)
    overrides = [
        "Global.synthetic_data=null",
        f"Global.save_model_dir={tmp_path / 'run'}",
        "Global.epoch_num=6",
        "Global.eval_batch_epoch=6",
        "Global.print_batch_step=8",
        f"Train.dataset.dataset_dir={data}",
        f"Eval.dataset.dataset_dir={data}",
        "Train.dataset.batch_transforms.0.BatchRandomResize.target_size=[64]",
        "Eval.dataset.transforms.1.Resize.target_size=[64, 64]",
        "Train.loader.num_workers=0",
        "Optimizer.lr.warmup_iters=10",
        "Optimizer.lr.decay_epochs=[5, 6]",
    ]
    config = load_config(CONFIG, overrides)
    record = RecordLosses()
    summary = build_trainer(config, DistEnv(), hooks=[record]).train()
    steps = record.values
    early = sum(v["loss_rpn_cls"] + v["loss_bbox_cls"] for v in steps[:8]) / 8
    late = sum(v["loss_rpn_cls"] + v["loss_bbox_cls"] for v in steps[-8:]) / 8
    assert all(math.isfinite(v["loss"]) for v in steps)
    assert late < 0.7 * early, (early, late)
    assert summary["images"] == 8 and 0.0 <= summary["ap"] <= 1.0 and summary["best_step"] == len(steps)
    checkpoint = os.path.join(tmp_path, "run", "best_accuracy")
    metrics = []
    for nproc in (1, 2):
        out = str(tmp_path / f"eval{nproc}")
        command = ["eval.py", "-c", CONFIG, "-o", *overrides, f"Global.checkpoints={checkpoint}"]
        check_ok(run_tool([*command, "--output_json", f"{out}.json", "--output_dir", out], nproc=nproc))
        with open(f"{out}.json", encoding="utf-8") as handle, open(os.path.join(out, "bbox.json")) as boxes:
            metrics.append((json.load(handle), json.load(boxes)))
    (single, single_boxes), (double, double_boxes) = metrics
    assert single == double and single["images"] == 8 and single["ap"] == summary["ap"]
    assert single_boxes == double_boxes and len(single_boxes) > 0
