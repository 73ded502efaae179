"""Paddle configs -> ppdist configs: the upstream PP-YOLOE / PP-LiteSeg / CRNN configs (copied
unchanged under tests/fixtures/paddle_configs) convert, validate, and build the original models."""

import json
import os

import pytest
import yaml

from ppdist import build_model, load_config
from ppdist.convert.configs.common import ppdist_defaults
from ppdist.convert.configs.convert import convert_config
from ppdist.convert.configs.detect import PADDLEDET, PADDLEOCR, PADDLESEG, PPDIST, UNKNOWN, detect_suite
from ppdist.convert.configs.paddledetection import load_det_yaml
from ppdist.convert.configs.paddleseg import load_seg_yaml
from ppdist.errors import ConfigError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "paddle_configs")
DET_S = os.path.join(FIXTURES, "PaddleDetection", "configs", "ppyoloe", "ppyoloe_crn_s_300e_coco.yml")
DET_PLUS_S = os.path.join(
    FIXTURES, "PaddleDetection", "configs", "ppyoloe", "ppyoloe_plus_crn_s_80e_coco.yml"
)
SEG_DIR = os.path.join(FIXTURES, "PaddleSeg", "configs", "pp_liteseg")
SEG_T = os.path.join(SEG_DIR, "pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml")
SEG_B = os.path.join(SEG_DIR, "pp_liteseg_stdc2_cityscapes_1024x512_scale0.5_160k.yml")
OCR_MV3 = os.path.join(FIXTURES, "PaddleOCR", "configs", "rec", "rec_mv3_none_bilstm_ctc.yml")
OCR_LITE = os.path.join(
    FIXTURES, "PaddleOCR", "configs", "rec", "ch_ppocr_v2.0", "rec_chinese_lite_train_v2.0.yml"
)


def trainable(model):
    model.train()
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def converted(path, tmp_path, overrides=()):
    """Convert ``path``, write the YAML, and load it back with ppdist's loader."""
    conversion = convert_config(path)
    out = tmp_path / "converted.yml"
    out.write_text(conversion.to_yaml(), encoding="utf-8")
    return conversion, load_config(str(out), list(overrides))


@pytest.mark.parametrize(
    "path,suite,params",
    [
        (DET_S, PADDLEDET, 8_084_588),
        (DET_PLUS_S, PADDLEDET, 8_084_588 + 6),  # + one RepVgg alpha per BasicBlock of the backbone (1+2+2+1)
        (SEG_T, PADDLESEG, 8_141_600),
        (SEG_B, PADDLESEG, 12_366_464),
        (OCR_MV3, PADDLEOCR, 1_451_787),
    ],
)
def test_upstream_configs_build_the_original_models(path, suite, params, tmp_path):
    conversion, config = converted(path, tmp_path)
    assert conversion.suite == suite
    assert trainable(build_model(config)) == params
    if suite != PADDLEOCR:  # load_config converts a Paddle file itself
        assert trainable(build_model(load_config(path))) == params


def test_detect_suite():
    assert detect_suite(DET_S) == PADDLEDET
    assert detect_suite(os.path.join(FIXTURES, "PaddleDetection", "configs", "runtime.yml")) == PADDLEDET
    assert detect_suite(SEG_B) == PADDLESEG
    assert detect_suite(OCR_MV3) == PPDIST
    assert detect_suite(os.path.join(REPO, "configs", "det", "ppyoloe_crn_s_300e_coco.yml")) == PPDIST


# --------------------------------------------------------------------------- key values
def test_ppyoloe_s_values(tmp_path):
    conversion, config = converted(DET_S, tmp_path)
    glob, opt = config["Global"], config["Optimizer"]
    assert (glob["epoch_num"], glob["num_classes"], glob["width_mult"], glob["depth_mult"]) == (
        300,
        80,
        0.5,
        0.33,
    )
    assert glob["use_ema"] and glob["ema_decay"] == 0.9998 and glob["ema_decay_type"] == "threshold"
    assert glob["use_sync_bn"] and glob["use_gpu"]
    assert (glob["save_epoch_step"], glob["eval_batch_epoch"], glob["print_batch_step"]) == (10, 10, 100)
    assert (
        opt["name"] == "Momentum"
        and opt["momentum"] == 0.9
        and opt["regularizer"] == {"name": "L2", "factor": 0.0005}
    )
    assert opt["lr"] == {
        "name": "CosineDecay",
        "learning_rate": 0.01,
        "max_epochs": 360,
        "warmup_epoch": 5,
        "warmup_start_lr": 0.0,
    }
    train, evaluation = config["Train"], config["Eval"]
    assert train["loader"]["batch_size_per_card"] == 8 and evaluation["loader"]["batch_size_per_card"] == 2
    assert train["loader"]["num_workers"] == 4 and train["loader"]["shuffle"] and train["loader"]["drop_last"]
    assert [next(iter(op)) for op in train["dataset"]["transforms"]] == [
        "Decode",
        "RandomDistort",
        "RandomExpand",
        "RandomCrop",
        "RandomFlip",
    ]
    assert [next(iter(op)) for op in train["dataset"]["batch_transforms"]] == [
        "BatchRandomResize",
        "NormalizeImage",
        "Permute",
        "PadGT",
    ]
    assert train["dataset"]["batch_transforms"][0]["BatchRandomResize"]["target_size"] == list(
        range(320, 769, 32)
    )
    assert evaluation["dataset"]["transforms"][1] == {
        "Resize": {"target_size": [640, 640], "keep_ratio": False, "interp": 2}
    }
    assert train["dataset"]["anno_path"] == "annotations/instances_train2017.json"
    assert evaluation["dataset"]["allow_empty"] is True
    assert config["Loss"]["static_assigner_epoch"] == 100
    assert config["PostProcess"] == {
        "name": "MultiClassNMS",
        "nms_top_k": 1000,
        "keep_top_k": 300,
        "score_threshold": 0.01,
        "nms_threshold": 0.7,
    }


def test_ppyoloe_plus_values_with_tagged_schedulers(tmp_path):
    conversion, config = converted(DET_PLUS_S, tmp_path)  # optimizer_80e.yml writes "- !CosineDecay"
    assert config["Global"]["epoch_num"] == 80
    assert config["Optimizer"]["lr"] == {
        "name": "CosineDecay",
        "learning_rate": 0.001,
        "max_epochs": 96,
        "warmup_epoch": 5,
        "warmup_start_lr": 0.0,
    }
    assert config["Architecture"]["Backbone"]["use_alpha"] is True
    assert config["Loss"]["static_assigner_epoch"] == 30
    norm = config["Train"]["dataset"]["batch_transforms"][1]["NormalizeImage"]
    assert norm["mean"] == [0.0, 0.0, 0.0] and norm["norm_type"] == "none"
    assert config["Global"]["save_epoch_step"] == 5


def test_pp_liteseg_t_values(tmp_path):
    conversion, config = converted(SEG_T, tmp_path)
    glob, opt = config["Global"], config["Optimizer"]
    assert (glob["max_iters"], glob["num_classes"], glob["ignore_index"]) == (160000, 19, 255)
    assert opt["name"] == "Momentum" and opt["momentum"] == 0.9 and opt["weight_decay"] == 5e-4
    assert opt["lr"] == {
        "name": "PolynomialDecay",
        "learning_rate": 0.005,
        "end_lr": 0.0,
        "power": 0.9,
        "warmup_iters": 1000,
        "warmup_start_lr": 1e-5,
    }
    assert config["Train"]["loader"]["batch_size_per_card"] == 4
    assert config["Eval"]["loader"]["batch_size_per_card"] == 1
    assert config["Loss"]["types"] == [{"name": "OhemCrossEntropyLoss", "min_kept": 130000}] * 3
    assert config["Loss"]["coef"] == [1, 1, 1]
    assert config["PostProcess"] == {"name": "SegPostProcess", "aug_eval": True, "scales": 0.5}
    assert config["Train"]["dataset"]["transforms"] == [
        {"ResizeStepScaling": {"min_scale_factor": 0.125, "max_scale_factor": 1.5, "scale_step_size": 0.125}},
        {"RandomPaddingCrop": {"crop_size": [1024, 512]}},
        {"RandomHorizontalFlip": {}},
        {"RandomDistort": {"brightness_range": 0.5, "contrast_range": 0.5, "saturation_range": 0.5}},
        {"Normalize": {}},
    ]
    assert config["Eval"]["dataset"]["transforms"] == [{"Normalize": {}}]
    head = config["Architecture"]["Head"]
    assert head["arm_out_chs"] == [32, 64, 128] and head["seg_head_inter_chs"] == [32, 64, 64]


def test_pp_liteseg_b_drops_the_inherited_model():
    config = convert_config(SEG_B).config
    assert config["Architecture"]["Backbone"] == {"name": "STDC2"}
    assert config["Architecture"]["Head"] == {"name": "PPLiteSegHead"}  # PaddleSeg's defaults: the B widths
    assert config["Global"]["max_iters"] == 160000


def test_overrides_apply_to_the_converted_config():
    config = load_config(SEG_T, ["Global.max_iters=10", "Train.loader.batch_size_per_card=2"])
    assert config["Global"]["max_iters"] == 10 and config["Train"]["loader"]["batch_size_per_card"] == 2


# --------------------------------------------------------------------------- same as the hand translations
def _plain(value):
    return json.loads(json.dumps(value))


def _normal(registry, entry):
    values = dict(ppdist_defaults(registry, entry["name"]))
    values.update(entry)
    values.pop("eval_size", None)
    return _plain(values)


def _ops(ops):
    from ppdist.registry import TRANSFORMS

    return [_normal(TRANSFORMS, dict(params or {}, name=name)) for op in ops for name, params in op.items()]


@pytest.mark.parametrize(
    "paddle,ours",
    [
        (DET_S, "configs/det/ppyoloe_crn_s_300e_coco.yml"),
        (DET_PLUS_S, "configs/det/ppyoloe_plus_crn_s_80e_coco.yml"),
        (SEG_T, "configs/seg/pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml"),
        (SEG_B, "configs/seg/pp_liteseg_stdc2_cityscapes_1024x512_scale0.5_160k.yml"),
    ],
)
def test_conversion_matches_the_hand_translated_config(paddle, ours):
    from ppdist.registry import BACKBONES, HEADS, LOSSES, NECKS, POSTPROCESSES

    a, b = load_config(paddle), load_config(os.path.join(REPO, ours))
    for key, registry in (("Backbone", BACKBONES), ("Neck", NECKS), ("Head", HEADS)):
        if key in b["Architecture"]:
            assert _normal(registry, a["Architecture"][key]) == _normal(registry, b["Architecture"][key]), key
    assert _normal(LOSSES, {k: v for k, v in a["Loss"].items() if k != "types"}) == _normal(
        LOSSES, {k: v for k, v in b["Loss"].items() if k != "types"}
    )
    assert [_normal(LOSSES, t) for t in a["Loss"].get("types", [])] == [
        _normal(LOSSES, t) for t in b["Loss"].get("types", [])
    ]
    assert _normal(POSTPROCESSES, a["PostProcess"]) == _normal(POSTPROCESSES, b["PostProcess"])
    assert _plain(a["Optimizer"]) == _plain(b["Optimizer"])
    for section in ("Train", "Eval"):
        for key in ("transforms", "batch_transforms"):
            assert _ops(a[section]["dataset"].get(key, [])) == _ops(b[section]["dataset"].get(key, [])), (
                section,
                key,
            )
        assert a[section]["loader"]["batch_size_per_card"] == b[section]["loader"]["batch_size_per_card"]
    for key in (
        "epoch_num",
        "max_iters",
        "num_classes",
        "ignore_index",
        "width_mult",
        "depth_mult",
        "use_ema",
        "ema_decay",
        "ema_decay_type",
        "use_sync_bn",
        "save_epoch_step",
        "eval_batch_epoch",
        "eval_batch_step",
    ):
        assert a["Global"][key] == b["Global"][key], key


# --------------------------------------------------------------------------- what is not converted
def test_unmapped_keys_are_listed_and_written_in_the_header():
    conversion = convert_config(DET_S)
    listed = "\n".join(conversion.unmapped)
    for key in (
        "pretrain_weights",
        "weights",
        "custom_black_list",
        "TestReader",
        "TestDataset",
        "export",
        "use_xpu",
        "print_flops",
    ):
        assert any(item.startswith(key) for item in conversion.unmapped), key
    assert (
        "download it" in listed and "-o Architecture.Backbone.pretrained=PATH" in listed
    )  # ImageNet CSPResNet
    plus = "\n".join(convert_config(DET_PLUS_S).unmapped)
    assert "obj365" in plus and "-o Global.pretrained_model=PATH" in plus  # the Objects365 detector
    header = conversion.to_yaml().split("\n\n", 1)[0]
    assert all(line.startswith("#") for line in header.splitlines())
    assert "CSPResNetb_s_pretrained" in header
    seg = convert_config(SEG_T)
    assert [item.split(" ")[0] for item in seg.unmapped] == ["model.backbone.pretrained"]
    assert "Architecture.Backbone.pretrained" in seg.unmapped[0] and "model.pdparams" in seg.unmapped[0]


def test_unsupported_options_and_ops_are_listed(tmp_path):
    child = tmp_path / "child.yml"
    child.write_text(f"""
_BASE_: [{DET_S}]
pretrain_weights: weights/CSPResNetb_s.pdparams
cycle_epoch: 10
OptimizerBuilder:
  clip_grad_by_value: 1.0
  clip_grad_by_norm: 35.0
TrainReader:
  sample_transforms:
    - Decode: {{}}
    - RandomDistort: {{random_channel: true, hue: [-10, 10, 0.2]}}
    - Mosaic: {{prob: 1.0}}
    - RandomFlip: {{}}
  mosaic_epoch: 10
CSPResNet:
  use_checkpoint: true
""")
    conversion = convert_config(str(child))
    keys = [item.split(" ")[0].rstrip(":") for item in conversion.unmapped]
    for key in (
        "cycle_epoch",
        "OptimizerBuilder.clip_grad_by_value",
        "TrainReader.sample_transforms[1].RandomDistort.random_channel",
        "TrainReader.sample_transforms[2].Mosaic",
        "TrainReader.mosaic_epoch",
        "CSPResNet.use_checkpoint",
    ):
        assert key in keys, key
    config = conversion.config
    assert config["Architecture"]["Backbone"]["pretrained"] == "weights/CSPResNetb_s.pdparams"
    assert "pretrained_model" not in config["Global"]
    assert config["Optimizer"]["clip_norm_global"] == 35.0
    ops = config["Train"]["dataset"]["transforms"]
    assert [next(iter(op)) for op in ops] == ["Decode", "RandomDistort", "RandomFlip"]
    assert ops[1]["RandomDistort"]["hue_range"] == 10 and ops[1]["RandomDistort"]["hue_prob"] == 0.2


def test_paddledetection_piecewise_warmup_keeps_its_milestones_from_step_zero(tmp_path):
    child = tmp_path / "child.yml"
    child.write_text(f"""
_BASE_: [{DET_S}]
LearningRate:
  base_lr: 0.01
  schedulers:
    - {{name: PiecewiseDecay, milestones: [8, 11], gamma: 0.1}}
    - {{name: LinearWarmup, epochs: 1, start_factor: 0.0}}
""")
    lr = convert_config(str(child)).config["Optimizer"]["lr"]
    assert lr == {
        "name": "Piecewise",
        "decay_epochs": [8, 11],
        "values": [0.01, pytest.approx(0.001), pytest.approx(0.0001)],
        "warmup_epoch": 1,
        "warmup_start_lr": 0.0,
        "boundaries_after_warmup": False,  # PaddleOCR's Piecewise counts them after the warm-up
    }


def test_local_backbone_weights_map_to_the_backbone_key(tmp_path):
    det = tmp_path / "det.yml"
    det.write_text(f"_BASE_: [{DET_PLUS_S}]\npretrain_weights: /w/ppyoloe_crn_s_obj365_pretrained.pdparams\n")
    weights = convert_config(str(det)).config["Global"]["pretrained_model"]
    assert weights == "/w/ppyoloe_crn_s_obj365_pretrained.pdparams"
    child = tmp_path / "child.yml"
    child.write_text(
        f"_base_: {SEG_T}\nmodel:\n  backbone:\n    pretrained: /data/PP_STDCNet1/model.pdparams\n"
    )
    config = convert_config(str(child)).config
    assert config["Architecture"]["Backbone"] == {
        "name": "STDC1",
        "pretrained": "/data/PP_STDCNet1/model.pdparams",
    }


def test_ocr_config_passes_through_with_unsupported_keys_removed_and_wandb_kept(tmp_path):
    conversion = convert_config(OCR_LITE)
    assert conversion.unmapped == []
    assert any("character_dict_path" in note for note in conversion.notes)
    path = tmp_path / "rec.yml"
    data = yaml.safe_load(open(OCR_MV3))
    data["Global"].update(use_wandb=True, my_key=1)
    data["Train"]["dataset"]["transforms"].insert(1, {"ABINetRecAug": {"geometry_p": 0.5}})
    data["wandb"] = {"project": "x"}
    path.write_text(yaml.safe_dump(data))
    conversion, config = converted(str(path), tmp_path)
    keys = [item.split(" ")[0].rstrip(":") for item in conversion.unmapped]
    assert {"Global.my_key", "Train.dataset.transforms[1]"} <= set(keys)
    assert "ABINetRecAug" not in str(config["Train"]["dataset"]["transforms"])
    assert config["Global"]["use_wandb"] is True and config["wandb"] == {"project": "x"}  # supported


# --------------------------------------------------------------------------- inheritance rules
def test_paddledetection_later_bases_win_and_paddleseg_earlier_bases_win(tmp_path):
    (tmp_path / "a.yml").write_text("x: 1\nd: {p: 1, q: 1}\nl: [1, 2]\n")
    (tmp_path / "b.yml").write_text("x: 2\nd: {q: 2}\nl: [3]\n")
    (tmp_path / "det.yml").write_text("_BASE_: [a.yml, b.yml]\nd: {r: 3}\n")
    assert load_det_yaml(str(tmp_path / "det.yml")) == {"x": 2, "d": {"p": 1, "q": 2, "r": 3}, "l": [3]}
    (tmp_path / "seg.yml").write_text("_base_: [a.yml, b.yml]\nd: {r: 3}\n")
    assert load_seg_yaml(str(tmp_path / "seg.yml")) == {"x": 1, "d": {"p": 1, "q": 1, "r": 3}, "l": [1, 2]}
    (tmp_path / "seg2.yml").write_text("_base_: a.yml\nd: {_inherited_: False, r: 3}\n")
    assert load_seg_yaml(str(tmp_path / "seg2.yml")) == {"x": 1, "d": {"r": 3}, "l": [1, 2]}


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "text,match",
    [
        ("architecture: MaskRCNN\nepoch: 12\n", r"architecture 'MaskRCNN' is not supported"),
        (
            "_BASE_: ['../missing/runtime.yml']\nepoch: 12\n",
            r"_BASE_ file not found: \.\./missing/runtime\.yml",
        ),
        ("_base_: nope.yml\niters: 10\n", r"_base_ file not found: nope\.yml"),
        (
            "model: {type: BiSeNetV2}\niters: 10\nbatch_size: 2\ntrain_dataset: {type: Cityscapes, dataset_root: d}\n",
            r"model type 'BiSeNetV2' is not supported",
        ),
        ("unknown_top_level: 1\n", r"cannot tell which suite"),
    ],
)
def test_bad_paddle_configs_give_one_line_errors(tmp_path, text, match):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        convert_config(str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_load_config_reports_a_bad_paddle_config_with_its_path(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("architecture: MaskRCNN\nepoch: 12\n")
    with pytest.raises(ConfigError, match=r"bad\.yml: architecture 'MaskRCNN'"):
        load_config(str(path))
    path.write_text("Globall: {}\n")
    with pytest.raises(ConfigError, match=r"unknown section 'Globall'"):
        load_config(str(path))  # not a Paddle config: ppdist's own message


def test_unknown_suite_detected(tmp_path):
    path = tmp_path / "other.yml"
    path.write_text("foo: 1\n_BASE_: []\n")
    assert detect_suite(str(path)) == UNKNOWN


def test_the_api_loader_converts_and_the_config_package_loader_does_not():
    import ppdist
    import ppdist.config
    import ppdist.convert.configs

    assert ppdist.load_config is ppdist.convert.configs.load_config
    assert load_config(DET_S)["Architecture"]["Backbone"]["name"] == "CSPResNet"
    with pytest.raises(ConfigError, match=r"ppyoloe_crn_s_300e_coco\.yml: unknown section"):
        ppdist.config.load_config(DET_S)  # ppdist's schema only
