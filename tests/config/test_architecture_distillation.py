"""Config validation of PP-OCRv3 architectures: a DistillationModel's models are checked stage by stage
with the same fix-it messages as a plain Architecture, before anything is built."""

import copy
import json
import os

import pytest
import torch
import yaml

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.convert.configs.paddleocr import convert_ocr
from ppdist.errors import ConfigError
from ppdist.modeling import DistillationModel

REC_CONFIG = os.path.join("configs", "rec", "rec_mv3_none_bilstm_ctc.yml")
PARAM_COUNTS = os.path.join("tests", "fixtures", "paddle_ppocrv3", "param_counts.json")


def distillation_config(repo_root, tmp_path, edit=None):
    """The CRNN recipe with ch_PP-OCRv3_rec_distillation.yml's Architecture (as PaddleOCR writes it)."""
    with open(os.path.join(repo_root, REC_CONFIG)) as f:
        config = yaml.safe_load(f)
    with open(os.path.join(repo_root, PARAM_COUNTS)) as f:
        config["Architecture"] = json.load(f)["ch_PP-OCRv3_rec_distillation.yml"]["architecture"]
    for model in config["Architecture"]["Models"].values():  # a small SAR head keeps the build cheap
        model["Head"]["head_list"][1]["SARHead"]["enc_dim"] = 16
    if edit:
        edit(config["Architecture"])
    for key in ("character_dict_path",):
        config["Global"].pop(key, None)
    path = tmp_path / "distill.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def test_distillation_architecture_validates_and_builds(repo_root, tmp_path):
    config = load_config(
        distillation_config(repo_root, tmp_path, _set(["Models", "Teacher", "freeze_params"], True))
    )
    model = build_model(config)
    assert isinstance(model, DistillationModel) and model.model_names == ["Teacher", "Student"]
    assert not any(p.requires_grad for p in model.Teacher.parameters())
    counts = [model.Student.head.ctc_head.out_channels, model.Teacher.head.ctc_head.out_channels]
    assert counts == [37, 37]  # out_channels_list of every model: the recipe's 36 characters + blank


def _set(path, value):
    def edit(arch):
        *parents, leaf = path
        for key in parents:
            arch = arch[key]
        if value is KeyError:
            del arch[leaf]
        else:
            arch[leaf] = value

    return edit


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (
            _set(["Models", "Student", "Backbone", "scal"], 0.5),
            r"unknown key Architecture.Models.Student.Backbone.scal .*'scale'",
        ),
        (_set(["name"], "Distilation"), r"unknown Architecture.name 'Distilation'.*'DistillationModel'"),
        (_set(["Models"], KeyError), r"Architecture.Models must map model names"),
        (
            _set(["Backbone"], {"name": "MobileNetV1Enhance"}),
            r"unknown key Architecture.Backbone for DistillationModel",
        ),
        (
            _set(["Models", "Teacher", "freeze_params"], "yes"),
            r"wrong type for Architecture.Models.Teacher.freeze_params",
        ),
        (
            _set(["Models", "Teacher", "Head", "name"], "MultiHaed"),
            r"unknown head name 'MultiHaed' at Architecture.Models.Teacher.Head.*'MultiHead'",
        ),
        (
            _set(["Models", "Student", "return_all_feat"], True),
            r"unknown key Architecture.Models.Student.return_all_feat.*'return_all_feats'",
        ),
        (
            _set(["Models", "Student", "Head", "head_list", 0, "CTCHead", "Neck", "dimz"], 8),
            r"unknown key Architecture.Models.Student.Head.head_list\[0\].CTCHead.Neck.dimz for neck "
            r"'SequenceEncoder'.*'dims'",
        ),
        (
            _set(["Models", "Teacher", "Head", "head_list", 1, "SARHead", "enc_dimm"], 8),
            r"unknown key Architecture.Models.Teacher.Head.head_list\[1\].SARHead.enc_dimm .*'enc_dim'",
        ),
        (
            _set(["Models", "Teacher", "Head", "head_list", 1], {"NRTRHead": {}}),
            r"Architecture.Models.Teacher.Head.head_list\[1\]: NRTRHead .*not supported yet",
        ),
        (
            _set(["Models", "Student", "pretrained"], 3),
            r"Architecture.Models.Student.pretrained must be a weights path",
        ),
    ],
)
def test_distillation_errors_name_the_model_and_key(repo_root, tmp_path, edit, pattern):
    path = distillation_config(repo_root, tmp_path, edit)
    with pytest.raises(ConfigError, match=pattern) as err:
        load_config(path)
    assert str(err.value).startswith(path) and "\n" not in str(err.value)


def test_plain_architecture_keeps_its_messages(repo_root):
    path = os.path.join(repo_root, REC_CONFIG)
    with pytest.raises(ConfigError, match=r"unknown key Architecture.Backbone.scal.*'scale'"):
        load_config(path, ["Architecture.Backbone.scal=0.5"])
    config = load_config(path, ["Architecture.name=BaseModel", "Architecture.return_all_feats=true"])
    model = build_model(config).train()
    feats = model(torch.zeros(2, 3, 32, 100))
    assert set(feats) == {"backbone_out", "neck_out", "head_out"} and feats["head_out"].shape == (2, 25, 37)


def test_paddleocr_conversion_keeps_the_models_and_lists_unknown_keys(repo_root, tmp_path):
    with open(os.path.join(repo_root, PARAM_COUNTS)) as f:
        arch = json.load(f)["ch_PP-OCRv3_rec_distillation.yml"]["architecture"]
    arch["Models"]["Student"]["Backbone"]["width"] = 2
    arch["Models"]["Teacher"]["stage"] = "x"
    path = tmp_path / "paddle.yml"
    path.write_text(yaml.safe_dump({"Architecture": copy.deepcopy(arch)}, sort_keys=False))
    conversion = convert_ocr(str(path))
    converted = conversion.config["Architecture"]
    assert [line.split(" ")[0] for line in conversion.unmapped] == [
        "Architecture.Models.Teacher.stage",
        "Architecture.Models.Student.Backbone.width",
    ]
    del arch["Models"]["Student"]["Backbone"]["width"], arch["Models"]["Teacher"]["stage"]
    assert converted == arch  # name, Models, freeze_params, pretrained, return_all_feats, head_list kept
