"""Evaluating nothing has no score: an error for tools/eval.py, never a new best in training."""

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
from ppdist.errors import EmptyEvaluationError
from ppdist.metrics.rec import RecMetric
from ppdist.metrics.seg import metrics_from_areas


class Identity(nn.Module):
    def forward(self, batch):
        return batch


def test_an_evaluation_of_no_sample_raises_instead_of_scoring():
    bad_only = [{"_bad_samples": ["img_1.jpg: file not found", "img_2.jpg: file not found"]}]
    evaluator = Evaluator(bad_only, lambda preds, batch: preds, RecMetric(), DistEnv())
    with pytest.raises(EmptyEvaluationError, match="no sample.*2 bad: img_1.jpg: file not found"):
        evaluator.run(Identity())


def test_the_best_model_is_kept_when_an_evaluation_saw_nothing(caplog):
    class Empty:
        last_fps = 0.0

        def run(self, model, desc=""):
            raise EmptyEvaluationError("the evaluation saw no sample")

    saved = []
    trainer = SimpleNamespace(
        position=SimpleNamespace(global_step=40),
        sync_buffers=lambda: None,
        check_finite=lambda: None,
        check_state_finite=lambda consequence: None,
        eval_model=lambda: None,
        save=lambda *args: saved.append(args),
    )
    hook = Evaluation(Empty(), "acc")
    hook.trainer = trainer
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
