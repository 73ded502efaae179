"""Evaluating nothing has no score: an error for tools/eval.py, never a new best in training."""

import json
import math
import os
from types import SimpleNamespace

import pytest
import torch
from ppdist_testing import run_tool, tiny_config
from torch import nn

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.evaluator import Evaluator
from ppdist.engine.hooks import Evaluation
from ppdist.engine.hooks.early_stopping import EarlyStopping
from ppdist.errors import EmptyEvaluationError
from ppdist.metrics.coco import COCOMetric
from ppdist.metrics.rec import RecMetric
from ppdist.metrics.seg import SegMetric, metrics_from_areas


class Identity(nn.Module):
    def forward(self, batch):
        return batch


def test_an_evaluation_of_no_sample_raises_instead_of_scoring():
    bad_only = [{"_bad_samples": ["img_1.jpg: file not found", "img_2.jpg: file not found"]}]
    evaluator = Evaluator(bad_only, lambda preds, batch: preds, RecMetric(), DistEnv())
    with pytest.raises(EmptyEvaluationError, match="no sample.*2 bad: img_1.jpg: file not found"):
        evaluator.run(Identity())


def evaluation_hook(evaluator, main_indicator, saved):
    """An Evaluation hook on a stand-in trainer: step 40, finite state, saves appended to ``saved``."""
    hook = Evaluation(evaluator, main_indicator)
    hook.trainer = SimpleNamespace(
        position=SimpleNamespace(global_step=40),
        sync_buffers=lambda: None,
        check_finite=lambda: None,
        check_state_finite=lambda consequence: None,
        eval_model=lambda: None,
        save=lambda *args: saved.append(args),
        writer=SimpleNamespace(add_scalars=lambda *args: None),
    )
    return hook


def test_the_best_model_is_kept_when_an_evaluation_saw_nothing(caplog):
    class Empty:
        last_fps = 0.0

        def run(self, model, desc=""):
            raise EmptyEvaluationError("the evaluation saw no sample")

    saved = []
    hook = evaluation_hook(Empty(), "acc", saved)
    hook.best = {"acc": 0.5, "best_epoch": 1, "best_step": 20}
    with caplog.at_level("WARNING", logger="ppdist"):
        assert hook.evaluate(2) == {}
    assert hook.best["acc"] == 0.5 and saved == [] and hook.last_eval_step == 40
    assert "the best model is kept" in caplog.text


def test_an_empty_union_counts_as_iou_0_as_in_paddleseg():
    no_pixels = metrics_from_areas([0, 0], [0, 0], [0, 0])
    assert no_pixels["miou"] == 0.0


def test_eval_tool_with_an_all_bad_eval_set_exits_2(tmp_path, digits_dir):
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "o"))
    labels = tmp_path / "missing.txt"
    labels.write_text("absent_1.jpg\t123\nabsent_2.jpg\t456\n", encoding="utf-8")
    weights = tmp_path / "w.pt"
    torch.save(build_model(load_config(cfg, ["Global.synthetic_data=null"])).state_dict(), weights)
    result = run_tool(
        [
            "eval.py",
            "-c",
            cfg,
            "-o",
            f"Eval.dataset.label_file_list=[{labels}]",
            f"Global.checkpoints={weights}",
        ]
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "no sample" in result.stderr and "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "o" / "best_accuracy.pt")


def _all_ignore_batches():
    """Two batches of 2 images whose every label pixel is ignore_index (255)."""
    generator = torch.Generator().manual_seed(0)
    return [
        {
            "label": torch.full((2, 4, 5), 255, dtype=torch.int64),
            "pred": torch.randint(0, 3, (2, 4, 5), generator=generator),
        }
        for _ in range(2)
    ]


def test_segmentation_with_every_label_pixel_ignored_reports_nothing_evaluated(caplog):
    """Was: miou 0.000000, acc 0, kappa 0 printed as if measured. Now nan and one warning; merged
    over 2 processes equal to 1 process."""
    batches = _all_ignore_batches()
    evaluator = Evaluator(batches, lambda preds, batch: batch["pred"], SegMetric(3), DistEnv())
    with caplog.at_level("WARNING", logger="ppdist"):
        metrics = evaluator.run(Identity())
    for key in ("miou", "acc", "kappa", "mdice"):
        assert math.isnan(metrics[key]), (key, metrics)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "nothing was evaluated" in warnings[0] and "ignore_index 255" in warnings[0]
    ranks = [SegMetric(3), SegMetric(3)]
    for metric, batch in zip(ranks, batches):
        metric.update(batch["pred"], batch)
    merged = SegMetric(3)
    merged.load_states([m.state() for m in ranks])
    assert repr(merged.compute()) == repr(metrics)  # nan where nan, the rest equal


def test_detection_set_without_boxes_reports_nothing_evaluated(tmp_path):
    """Was: ap 0.000000 (or COCO's -1) printed as a score for a set with no ground-truth box."""
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 100, "height": 80} for i in (1, 2)]
    path = tmp_path / "gt.json"
    path.write_text(json.dumps({"images": images, "annotations": [], "categories": [{"id": 3, "name": "a"}]}))
    dataset = SimpleNamespace(anno_file=str(path), clsid2catid={0: 3}, label_list=["a"])
    results = [
        {
            "im_id": i,
            "boxes": torch.tensor([[10.0, 10.0, 40.0, 30.0]]) if i == 1 else torch.zeros(0, 4),
            "scores": torch.tensor([0.9]) if i == 1 else torch.zeros(0),
            "labels": torch.tensor([0]) if i == 1 else torch.zeros(0, dtype=torch.long),
        }
        for i in (1, 2)
    ]
    metric = COCOMetric(backend="pycocotools")
    metric.bind_dataset(dataset)
    metric.update(results, {})
    out = metric.compute()
    assert math.isnan(out["ap"]) and math.isnan(out["ap50"]) and out["images"] == 2
    assert "no ground-truth box" in metric.nothing_evaluated


def test_a_nan_score_never_becomes_the_best(caplog):
    class NothingEvaluated:
        last_fps = 0.0
        last_nonfinite_batches = 0

        def run(self, model, desc=""):
            return {"miou": float("nan"), "acc": float("nan"), "images": 4}

    saved = []
    hook = evaluation_hook(NothingEvaluated(), "miou", saved)
    hook.evaluate(1)  # the first evaluation: nothing to compare with, still not a best
    assert hook.best == {} and saved == []
    hook.best = {"miou": 0.5, "best_epoch": 1, "best_step": 20}
    hook.evaluate(2)
    assert hook.best["miou"] == 0.5 and saved == []


def test_early_stopping_neither_counts_nor_keeps_a_nan_score():
    evaluation = Evaluation(None, "miou")
    stops = []
    trainer = SimpleNamespace(hook=lambda name: evaluation, finished=False, request_stop=stops.append)
    early = EarlyStopping(patience=1)
    early.trainer = trainer
    for step, value in ((2, float("nan")), (4, 0.3), (6, float("nan")), (8, float("nan"))):
        evaluation.last_eval_step, evaluation.last_metrics = step, {"miou": value}
        early.after_step()
    assert early.best == 0.3 and early.bad_evaluations == 0 and stops == []
