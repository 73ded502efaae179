"""ppdist.tasks: a config's task is resolved in one place, from its post-process, for every shipped
config the same as the model's ``model_type``; a task and a post-process are registered once."""

from __future__ import annotations

import glob
import os

import pytest
import torch
from ppdist_testing import REPO

from ppdist.config import load_config
from ppdist.errors import ConfigError
from ppdist.tasks import TASKS, get_task, task_of
from ppdist.tasks.registry import Task, register_task, task_by_postprocess

CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*", "*.yml")))


def test_the_four_tasks_are_registered_with_their_graphs():
    assert sorted(TASKS) == ["det", "rec", "seg", "table"]
    assert task_by_postprocess() == {
        "CTCLabelDecode": "rec",
        "DistillationCTCLabelDecode": "rec",
        "MultiClassNMS": "det",
        "BBoxPostProcess": "det",
        "SegPostProcess": "seg",
        "TableLabelDecode": "table",
    }
    assert TASKS["det"].graph_outputs() == ["bbox", "bbox_num"]
    assert TASKS["det"].graph_outputs(exclude_nms=True) == ["boxes", "scores"]
    assert TASKS["rec"].graph_outputs(exclude_nms=True) == ["probs"]  # nothing to leave out
    assert [TASKS[t].inputs for t in ("rec", "det")] == [("image",), ("image", "scale_factor")]
    assert [t for t in sorted(TASKS) if TASKS[t].test_time_augmentation] == ["seg"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, REPO))
def test_every_shipped_config_resolves_to_its_models_type(path):
    config = load_config(path, ["Global.synthetic_data=null"])
    assert task_of(config) == config["Architecture"]["model_type"]
    assert get_task(config) is TASKS[config["Architecture"]["model_type"]]


def test_an_unknown_post_process_is_a_config_error_that_lists_the_known_ones():
    with pytest.raises(
        ConfigError, match=r"PostProcess.name 'DBPostProcess' names no task.*'CTCLabelDecode'"
    ):
        task_of({"PostProcess": {"name": "DBPostProcess"}})
    with pytest.raises(ConfigError, match="names no task"):
        task_of({"Architecture": {"model_type": "rec"}})  # no PostProcess
    with pytest.raises(ConfigError, match=r"unknown task 'ocr'"):
        get_task("ocr")


def test_a_task_or_post_process_registered_twice_is_refused():
    rec = TASKS["rec"]
    with pytest.raises(ValueError, match="task 'rec' is registered twice"):
        register_task(rec)
    stealing = Task(
        "ocr", ("CTCLabelDecode",), ("image",), ("probs",), rec.build_deploy, rec.runner, rec.writer
    )
    with pytest.raises(ValueError, match="'CTCLabelDecode' belongs to task 'rec'"):
        register_task(stealing)
    assert "ocr" not in TASKS


def test_labels_a_config_names_and_labels_an_export_writes(tmp_path):
    det = load_config(
        os.path.join(REPO, "configs", "det", "quickstart_synth.yml"), ["Global.synthetic_data=null"]
    )
    seg = load_config(
        os.path.join(REPO, "configs", "seg", "quickstart_synth.yml"), ["Global.synthetic_data=null"]
    )
    rec = load_config(
        os.path.join(REPO, "configs", "rec", "quickstart_synth.yml"), ["Global.synthetic_data=null"]
    )
    assert [d["name"] for d in TASKS["det"].config_labels(det)][:1] == ["class_0"]  # no annotation file here
    assert TASKS["seg"].config_labels(seg)["num_classes"] == seg["Global"]["num_classes"]
    assert TASKS["rec"].config_labels(rec) is None  # the dictionary is a file the config points to
    postprocess = {"name": "CTCLabelDecode"}
    labels = TASKS["rec"].inference_labels(str(tmp_path), rec, postprocess)
    lines = (tmp_path / "characters.txt").read_text(encoding="utf-8").splitlines()
    assert labels == {"num_characters": len(lines), "file": "characters.txt"} and len(lines) > 10
    assert postprocess["character_dict_path"] == "characters.txt"


QUICKSTARTS = sorted(glob.glob(os.path.join(REPO, "configs", "*", "quickstart_synth.yml")))


@pytest.mark.parametrize("path", QUICKSTARTS, ids=lambda p: p.split(os.sep)[-2])
def test_every_task_makes_seeded_training_samples_at_any_size(path):
    config = load_config(path, ["Global.synthetic_data=null"])
    sample = get_task(config).training_sample
    first, again, other = (
        sample(config, (32, 48), 3),
        sample(config, (32, 48), 3),
        sample(config, (32, 48), 4),
    )
    assert first["image"].shape == (3, 32, 48)
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["image"], other["image"])
