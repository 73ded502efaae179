"""PaddleOCR's SLANet.yml and SLANet_ch.yml (copied unchanged under tests/fixtures/paddle_configs)
load through ppdist's loader and build PaddleOCR's model: the head's class count comes from
TableLabelDecode, the trainable parameters are the ones Paddle counts."""

import copy
import logging
import os

import pytest
from ppdist_testing import ppdist_log_records

import ppdist  # noqa: F401  (registers every component)
from ppdist import build_model, load_config
from ppdist.cli_compat import set_learning_rate
from ppdist.components import build_postprocess
from ppdist.config import load_yaml_with_bases, validate
from ppdist.convert.configs import PPDIST, convert_config, detect_suite
from ppdist.engine.checkpoint.weights import load_initial_weights
from ppdist.errors import ConfigError
from ppdist.optim import build_lr_schedule

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
UPSTREAM = os.path.join(REPO, "tests", "fixtures", "paddle_configs", "PaddleOCR", "configs", "table")
SLANET, SLANET_CH = os.path.join(UPSTREAM, "SLANet.yml"), os.path.join(UPSTREAM, "SLANet_ch.yml")
# PaddleOCR 2.7's trainable parameters for each file's model, measured with Paddle (issue 31)
PADDLE_PARAMS = {SLANET: 1_875_714, SLANET_CH: 1_897_242}
CLASSES = {SLANET: 30, SLANET_CH: 50}  # sos + dictionary (<td></td> merged in, <td> out) + eos


@pytest.fixture(scope="module", params=[SLANET, SLANET_CH], ids=os.path.basename)
def loaded(request):
    return request.param, load_config(request.param)


def test_files_load_unchanged_with_their_paddle_keys(loaded):
    path, config = loaded
    glob_ = config["Global"]
    assert glob_["box_format"] == ("xyxy" if path == SLANET else "xyxyxyxy")  # accepted, no effect
    assert glob_["use_sync_bn"] is True and glob_["max_text_length"] == 500
    assert glob_["save_res_path"] == "output/infer" and glob_["infer_mode"] is False
    assert glob_.get("amp_custom_white_list") == (
        ["concat", "elementwise_sub", "set_value"] if path == SLANET else None
    )  # acts only with use_amp, off here
    backbone = config["Architecture"]["Backbone"]
    assert (backbone["pretrained"], backbone["use_ssld"]) == (True, True)
    opt = config["Optimizer"]
    assert (opt["name"], opt["clip_norm"], opt["regularizer"]["factor"]) == ("Adam", 5.0, 0.0)


def test_files_are_read_as_ppdist_configs_and_convert_keeping_every_key(loaded):
    path, _ = loaded
    assert detect_suite(path) == PPDIST
    assert convert_config(path).unmapped == []  # the AMP op list too: no effect without use_amp


def test_model_has_paddles_class_count_and_parameter_count(loaded):
    path, config = loaded
    assert build_postprocess(config).num_classes == CLASSES[path]
    model = build_model(config)
    assert model.head.out_channels == CLASSES[path]
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == PADDLE_PARAMS[path]


def test_learning_rates_are_paddles():
    piecewise = build_lr_schedule(load_config(SLANET)["Optimizer"]["lr"], 100, 10)
    assert [piecewise.lr_at(s) for s in (0, 399, 400, 499, 500)] == [0.001, 0.001, 0.0001, 0.0001, 0.00005]
    const = build_lr_schedule(load_config(SLANET_CH)["Optimizer"]["lr"], 400, 10)  # no name: Const
    assert [const.lr_at(s) for s in (0, 3999)] == [0.001, 0.001]


def test_piecewise_refuses_a_learning_rate_it_would_not_use():
    lr = copy.deepcopy(load_config(SLANET)["Optimizer"]["lr"])
    lr["learning_rate"] = 0.01
    with pytest.raises(ConfigError, match=r"Optimizer\.lr\.learning_rate \(0\.01\) is not read by Piecewise"):
        build_lr_schedule(lr, 100, 10)


@pytest.mark.parametrize(
    "section,key,value,match",
    [
        ("Global", "use_amp", True, r"Global\.amp_custom_white_list is not supported yet .*use_amp"),
        ("Global", "box_format", "xyyx", r"Global\.box_format must be one of"),
        ("Backbone", "pretrained", 3, r"Architecture\.Backbone\.pretrained must be a weights path"),
    ],
)
def test_bad_values_are_refused_by_key(section, key, value, match):
    config = load_yaml_with_bases(SLANET)
    where = config["Global"] if section == "Global" else config["Architecture"]["Backbone"]
    where[key] = value
    with pytest.raises(ConfigError, match=match) as info:
        validate(config)
    assert "\n" not in str(info.value)


def test_pretrained_true_downloads_nothing_and_says_so_in_one_line(loaded):
    _, config = loaded
    model = build_model(config)
    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    with ppdist_log_records(logging.INFO) as records:
        assert load_initial_weights(model, config) is False
    lines = [r.getMessage() for r in records if "Backbone.pretrained" in r.getMessage()]
    assert len(lines) == 1 and "downloads nothing" in lines[0] and "local" in lines[0]
    assert all((v == before[k]).all() for k, v in model.backbone.state_dict().items())


# --------------------------------------------------------------------------- ppdist's own configs
RECIPE = os.path.join(REPO, "configs", "table", "SLANet.yml")
QUICKSTART = os.path.join(REPO, "configs", "table", "quickstart_synth.yml")


def test_recipe_is_the_upstream_file_with_the_bundled_dictionary():
    upstream, ours = load_yaml_with_bases(SLANET), load_yaml_with_bases(RECIPE)
    upstream["Global"]["character_dict_path"] = "ppdist/data/dicts/table_structure_dict.txt"
    assert ours == upstream
    assert os.path.isfile(os.path.join(REPO, ours["Global"]["character_dict_path"]))


def test_quickstart_trains_the_recipes_model_on_synthetic_tables():
    config = load_config(QUICKSTART, ["Global.synthetic_data=null"])
    recipe = load_config(RECIPE)
    for section in ("Loss", "PostProcess"):
        assert config[section] == recipe[section], section
    assert config["Metric"] == {**recipe["Metric"], "teds": True}
    head = {**recipe["Architecture"]["Head"], "max_text_length": 50}
    backbone = {**recipe["Architecture"]["Backbone"], "pretrained": False, "use_ssld": False}
    assert config["Architecture"] == {**recipe["Architecture"], "Head": head, "Backbone": backbone}
    assert config["Global"]["max_text_length"] == 50
    assert {k: v for k, v in config["Optimizer"].items() if k != "lr"} == {
        k: v for k, v in recipe["Optimizer"].items() if k != "lr"
    }
    assert config["Optimizer"]["lr"] == {"name": "Cosine", "learning_rate": 0.003, "warmup_epoch": 0.02}
    spec = load_yaml_with_bases(QUICKSTART)["Global"]["synthetic_data"]
    assert spec["kind"] == "table"
    for section in ("Train", "Eval"):
        dataset = config[section]["dataset"]
        assert os.path.normpath(dataset["data_dir"]) == os.path.normpath(spec["data_dir"])
        ops = {next(iter(op)): op[next(iter(op))] for op in dataset["transforms"]}
        recipe_ops = {next(iter(op)): op[next(iter(op))] for op in recipe[section]["dataset"]["transforms"]}
        assert ops["ResizeTableImage"] == {"max_len": 160}
        assert ops["PaddingTableImage"] == {"size": [160, 160]}
        for name in ("DecodeImage", "TableBoxEncode", "NormalizeImage", "ToCHWImage"):
            assert ops[name] == recipe_ops[name], (section, name)
        # the recipe's keys and the structure length
        assert ops["KeepKeys"]["keep_keys"] == [
            "image",
            "structure",
            "bboxes",
            "bbox_masks",
            "length",
            "shape",
        ]
        assert ops["TableLabelEncode"] == {**recipe_ops["TableLabelEncode"], "max_text_length": 50}
        assert list(ops) == list(recipe_ops)


def test_learning_rate_flag_keeps_piecewise_learning_rate_its_first_value():
    config = load_config(SLANET)
    set_learning_rate(config, 0.002)
    lr = config["Optimizer"]["lr"]
    assert lr["values"] == [0.002, 0.0002, 0.0001] and lr["learning_rate"] == 0.002
    assert build_lr_schedule(lr, 100, 10).lr_at(0) == 0.002
