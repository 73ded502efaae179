"""Config validation across sections: values no step could use are refused by key before any
model is built."""

import os

import pytest

from ppdist.config import load_config
from ppdist.errors import ConfigError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DISTILLATION = os.path.join(REPO, "configs", "rec", "PP-OCRv3", "ch_PP-OCRv3_rec_distillation.yml")
CRNN = os.path.join(REPO, "configs", "rec", "rec_mv3_none_bilstm_ctc.yml")


@pytest.mark.parametrize(
    "path, override, message",
    [
        (
            DISTILLATION,
            "Loss.loss_config_list.0.DistillationDMLLoss.weight=.nan",
            r": Loss.loss_config_list\[0\].DistillationDMLLoss.weight must be a finite number, got nan$",
        ),
        (
            DISTILLATION,
            "Loss.loss_config_list.2.DistillationDistanceLoss.weight=-.inf",
            r": Loss.loss_config_list\[2\].DistillationDistanceLoss.weight must be a finite number, got -inf$",
        ),
    ],
)
def test_a_non_finite_loss_number_is_refused_naming_its_key(path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(path, [override])


SLANET = os.path.join(REPO, "configs", "table", "SLANet.yml")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["Architecture.Head.loc_reg_num=8"],
            r": Train.dataset.transforms\[1\].TableLabelEncode.loc_reg_num is 4 but Architecture.Head.loc_reg_num "
            r"is 8: the head predicts as many box coordinates per cell as the labels hold",
        ),
        (
            ["Eval.dataset.transforms.1.TableLabelEncode.loc_reg_num=8"],
            r": Eval.dataset.transforms\[1\].TableLabelEncode.loc_reg_num is 8 but Architecture.Head.loc_reg_num is 4",
        ),
    ],
)
def test_the_heads_box_coordinates_must_be_the_labels(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(SLANET, overrides)
