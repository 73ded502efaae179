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
