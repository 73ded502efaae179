"""One model of a distillation checkpoint (issue 44): ``Architecture.Models.<name>.pretrained`` takes
the model of its own name from a whole distillation checkpoint and ``path#Name`` another one; a
distillation checkpoint given for one model, or a single-model one for the distillation model, is
refused in one line that says what the file holds and what fits (training's starting weights and
evaluation / export alike); a missing weights file names its config key.

Two tiny random recognisers (MobileNetV1Enhance 0.1 + CTC head) side by side as Teacher and Student,
saved as a ppdist distillation checkpoint, and one alone as a single-model checkpoint."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from ppdist_testing import ppdist_log_records

from ppdist.components import build_model
from ppdist.engine.checkpoint import load_file, load_inference_weights, load_initial_weights, load_pretrained
from ppdist.engine.checkpoint.parts import model_parts, part_state, split_part
from ppdist.errors import CheckpointPathError, ConfigError

ONE = {
    "model_type": "rec",
    "algorithm": "CRNN",
    "Backbone": {"name": "MobileNetV1Enhance", "scale": 0.1},
    "Head": {"name": "CTCHead"},
}


def config(teacher=None, student=None, pretrained_model=None, models=("Teacher", "Student")):
    """A distillation config of two ONE models (``teacher`` / ``student``: their ``pretrained``);
    ``models=None``: ONE alone."""
    if models is None:
        arch = copy.deepcopy(ONE)
    else:
        arch = {"model_type": "rec", "name": "DistillationModel", "algorithm": "Distillation", "Models": {}}
        for name, pretrained in zip(models, (teacher, student)):
            arch["Models"][name] = dict(
                copy.deepcopy(ONE), **({"pretrained": pretrained} if pretrained else {})
            )
    return {
        "Global": {
            "character_dict_path": None,
            "use_space_char": False,
            "pretrained_model": pretrained_model,
        },
        "Architecture": arch,
        "PostProcess": {"name": "CTCLabelDecode"},
    }


def built(cfg, seed=0):
    torch.manual_seed(seed)
    return build_model(cfg), cfg


def same(module, reference):
    state = reference.state_dict()
    return all(torch.equal(value, state[key]) for key, value in module.state_dict().items())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """``distill.pt`` (Teacher + Student, with its config), ``renamed.pt`` (the same models named
    Big and Small), ``single.pt`` (one model) and the models they hold."""
    root = tmp_path_factory.mktemp("parts")
    distill, cfg = built(config(), seed=1)
    torch.save({"model": distill.state_dict(), "config": cfg}, root / "distill.pt")
    renamed = {
        key.replace("Teacher.", "Big.").replace("Student.", "Small."): value
        for key, value in distill.state_dict().items()
    }
    torch.save({"model": renamed}, root / "renamed.pt")
    single, _ = built(config(models=None), seed=2)
    torch.save({"model": single.state_dict()}, root / "single.pt")
    return {"root": root, "distill": distill, "single": single}


def test_parts_of_a_state_and_the_name_suffix():
    keys = ["module.Teacher.backbone.a", "Teacher.head.b", "Student.neck.c", "Student.head.d"]
    assert model_parts(keys) == ["Teacher", "Student"]
    assert model_parts(["backbone.a", "head.fc.weight", "neck.head.x"]) == []  # a single model
    assert part_state(dict.fromkeys(keys, 0), "Teacher") == {"backbone.a": 0, "head.b": 0}
    assert split_part("out/a#b/best_accuracy#Student") == ("out/a#b/best_accuracy", "Student")
    assert split_part("out/best_accuracy") == ("out/best_accuracy", None)
    assert split_part("out/x#1.pt") == ("out/x#1.pt", None)  # not a model name


def test_teacher_pretrained_takes_the_teacher_of_a_distillation_checkpoint(files):
    path = str(files["root"] / "distill.pt")
    model, cfg = built(config(teacher=path))
    with ppdist_log_records(logging.INFO) as records:
        assert load_initial_weights(model, cfg) is True
    assert same(model.Teacher, files["distill"].Teacher)
    assert not same(model.Student, files["distill"].Student)  # its own initial weights
    messages = [r.getMessage() for r in records]
    assert (
        f"Architecture.Models.Teacher.pretrained {path} is a distillation checkpoint (models Teacher, "
        "Student): loading its Teacher" in messages
    )


def test_a_suffix_chooses_the_model_of_a_distillation_checkpoint(files):
    path = str(files["root"] / "distill")  # a prefix finds distill.pt
    model, cfg = built(config(teacher=f"{path}#Student"))
    load_initial_weights(model, cfg)
    assert same(model.Teacher, files["distill"].Student)  # a trained Student as the Teacher
    single, _ = built(config(models=None))
    load_pretrained(single, f"{path}#Teacher")  # Global.pretrained_model of a single-model config
    assert same(single, files["distill"].Teacher)
    named = files["root"] / "single#v2.pt"  # a file named with a '#' is that file
    named.write_bytes((files["root"] / "single.pt").read_bytes())
    load_pretrained(single, str(files["root"] / "single#v2"))
    assert same(single, files["single"])


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            dict(models=None, pretrained_model="{root}/distill.pt"),
            "Global.pretrained_model {root}/distill.pt is a whole distillation checkpoint (models Teacher, "
            "Student) and Architecture is one model: choose the model to load with a #<name> suffix, e.g. "
            "Global.pretrained_model: {root}/distill.pt#Student",
        ),
        (
            dict(teacher="{root}/renamed.pt"),
            "Architecture.Models.Teacher.pretrained {root}/renamed.pt is a whole distillation checkpoint "
            "(models Big, Small) with no model named Teacher: choose the model to load with a #<name> "
            "suffix, e.g. Architecture.Models.Teacher.pretrained: {root}/renamed.pt#Small",
        ),
        (
            dict(student="{root}/distill.pt#Nobody"),
            "Architecture.Models.Student.pretrained {root}/distill.pt#Nobody: a distillation checkpoint "
            "(models Teacher, Student), with no model 'Nobody' in it; choose one with #Student",
        ),
        (
            dict(models=None, pretrained_model="{root}/single.pt#Student"),
            "Global.pretrained_model {root}/single.pt#Student: a single-model checkpoint, with no model "
            "'Student' in it; give the path without #Student",
        ),
        (
            dict(pretrained_model="{root}/single.pt"),
            "Global.pretrained_model {root}/single.pt is a single-model checkpoint and Architecture is a "
            "distillation model of Teacher, Student: give it to one of them as "
            "Architecture.Models.<name>.pretrained",
        ),
    ],
    ids=["whole-for-one", "no-model-of-that-name", "unknown-suffix", "suffix-on-single", "single-for-whole"],
)
def test_weights_of_the_other_kind_are_refused_saying_what_to_give(files, edit, message):
    root = str(files["root"])
    model, cfg = built(
        config(**{k: v.format(root=root) if isinstance(v, str) else v for k, v in edit.items()})
    )
    with pytest.raises(ConfigError) as info:
        load_initial_weights(model, cfg)
    assert str(info.value) == message.format(root=root)


def test_evaluation_says_which_checkpoint_it_is_and_which_config_fits(files):
    """tools/eval.py and export load Global.checkpoints through load_inference_weights."""
    root = files["root"]
    single, _ = built(config(models=None))
    with pytest.raises(ConfigError) as info:
        load_inference_weights(single, load_file(str(root / "distill.pt")), "distill.pt")
    assert str(info.value) == (
        "distill.pt is a distillation checkpoint (models Teacher, Student) and Architecture is one "
        "model: use the distillation config it was trained with (Architecture.Models: Teacher, Student); "
        "its config is stored in it (and as config.yml in its run folder)"
    )
    distill, _ = built(config())
    with pytest.raises(ConfigError) as info:
        load_inference_weights(distill, load_file(str(root / "single.pt")), "single.pt")
    assert str(info.value) == (
        "single.pt is a single-model checkpoint and Architecture is a distillation model of Teacher, "
        "Student: use a config with one model, the one it was trained with (its tensors fit "
        "Architecture.Models.Teacher and Student)"
    )


@pytest.mark.parametrize(
    "edit, key",
    [
        (dict(student="{root}/missing"), "Architecture.Models.Student.pretrained"),
        (dict(pretrained_model="{root}/missing"), "Global.pretrained_model"),
    ],
)
def test_a_missing_weights_file_names_its_key(files, edit, key):
    root = str(files["root"])
    model, cfg = built(config(**{k: v.format(root=root) for k, v in edit.items()}))
    with pytest.raises(CheckpointPathError) as info:
        load_initial_weights(model, cfg)
    assert str(info.value).startswith(f"{key}: checkpoint not found: {root}/missing (looked for ")
    assert info.value.exit_code == 2
