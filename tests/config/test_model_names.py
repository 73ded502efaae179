"""A distillation config's model names are checked before any model is built: every name a loss,
the post-process or Metric.key uses is a model of Architecture.Models (issue 44: they failed at
the first step, Metric.key at the first evaluation with nothing saved)."""

import os

import pytest
import yaml

from ppdist.config import load_config
from ppdist.errors import ConfigError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DISTILLATION = os.path.join(REPO, "configs", "rec", "PP-OCRv3", "ch_PP-OCRv3_rec_distillation.yml")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["Metric.key=student"],
            r": Metric.key: 'student' is not a model of Architecture.Models. Did you mean: 'Student'\?$",
        ),
        (
            ["PostProcess.model_name=[Student, Teachr]"],
            r": PostProcess.model_name\[1\]: 'Teachr' is not a model of Architecture.Models. Did you mean: 'Teacher'\?$",
        ),
        (
            ["Loss.loss_config_list.2.DistillationDistanceLoss.model_name_pairs=[[Student, Teacher2]]"],
            r": Loss.loss_config_list\[2\].DistillationDistanceLoss.model_name_pairs\[0\]\[1\]: 'Teacher2' is not a "
            r"model of Architecture.Models. Did you mean: 'Teacher'\?$",
        ),
        (
            ["Loss.loss_config_list.4.DistillationSARLoss.model_name_list=[Student, Pupil]"],
            r"DistillationSARLoss.model_name_list\[1\]: 'Pupil' is not a model of Architecture.Models. Valid names: "
            r"Student, Teacher.$",
        ),
        (
            ["Loss.loss_config_list.0.DistillationDMLLoss.model_name_pairs=[[Student]]"],
            r": Loss.loss_config_list\[0\].DistillationDMLLoss.model_name_pairs must be a list of \[model, model\] pairs",
        ),
        (
            ["PostProcess.model_name=Student", "Metric.key=Teacher"],
            r": Metric.key: 'Teacher' is not one of the models PostProcess.model_name decodes \(the results hold no "
            r"other\). Valid names: Student.$",
        ),
    ],
)
def test_a_name_that_is_no_model_is_a_config_error_with_the_closest_names(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(DISTILLATION, overrides)


def test_a_renamed_model_is_named_where_the_old_name_is_still_used(tmp_path):
    with open(DISTILLATION) as handle:
        config = yaml.safe_load(handle)
    models = config["Architecture"]["Models"]
    models["Teacher_v2"] = models.pop("Teacher")
    path = tmp_path / "renamed.yml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(
        ConfigError,
        match=r": PostProcess.model_name\[1\]: 'Teacher' is not a model of Architecture.Models. "
        r"Did you mean: 'Teacher_v2'\?",
    ):
        load_config(str(path))


def test_the_recipe_names_only_its_models():
    assert load_config(DISTILLATION)["Metric"]["key"] == "Student"
