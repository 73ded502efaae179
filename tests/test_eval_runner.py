"""tools/eval.py's picture options go into the Metric section, or are refused with the reason."""

import pytest
from ppdist_testing import DET_QUICKSTART, QUICKSTART

from ppdist.config import load_config
from ppdist.errors import ConfigError
from ppdist.eval_runner import set_picture_options


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
