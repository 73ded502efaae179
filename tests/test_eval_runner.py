"""tools/eval.py's picture options go into the Metric section, or are refused with the reason; a
checkpoint with NaN/Inf tensors is evaluated with a one-line warning naming them."""

import logging

import pytest
import torch
from ppdist_testing import DET_QUICKSTART, QUICKSTART, tiny_run_config

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.errors import ConfigError
from ppdist.eval_runner import evaluate_checkpoint, set_picture_options


def test_iou_and_score_set_the_detection_confusion_matrix():
    config = load_config(DET_QUICKSTART)
    set_picture_options(config, "pictures", iou=0.6, score=0.1)
    assert config["Metric"]["confusion_iou"] == 0.6 and config["Metric"]["confusion_score"] == 0.1
    assert config["Metric"]["output_dir"] == "pictures"  # bbox.json beside the pictures


@pytest.mark.parametrize(
    "config_file, output_dir, iou, score, message",
    [
        (
            QUICKSTART,
            "pictures",
            0.5,
            None,
            "--iou sets the detection confusion matrix .* Metric is RecMetric",
        ),
        (DET_QUICKSTART, None, None, 0.3, "--score .* --output_dir is not set"),
        (DET_QUICKSTART, "pictures", 1.5, None, "--iou must be between 0 and 1, got 1.5"),
    ],
)
def test_picture_options_that_do_not_apply_are_refused(config_file, output_dir, iou, score, message):
    config = load_config(config_file)
    with pytest.raises(ConfigError, match=message):
        set_picture_options(config, output_dir, iou, score)


def test_a_checkpoint_with_nonfinite_tensors_is_evaluated_with_a_one_line_warning(
    tmp_path, digits_dir, caplog
):
    config = tiny_run_config(tmp_path, digits_dir, "run")
    state = build_model(config).state_dict()
    name = next(k for k in state if k.endswith("running_var"))
    state[name][:2] = float("nan")
    path = str(tmp_path / "nan.pt")
    torch.save({"model": state}, path)
    config["Global"]["checkpoints"] = path
    with caplog.at_level(logging.WARNING, logger="ppdist"):
        evaluate_checkpoint(config, DistEnv())
    warnings = [r.getMessage() for r in caplog.records if "is not finite" in r.getMessage()]
    size = state[name].numel()
    assert warnings == [
        f"{path} is not finite: 1 tensor(s) hold NaN/Inf values ({name}: 2 of {size}); its metrics are "
        f"those of a broken model"
    ]
