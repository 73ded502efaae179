"""PaddleDetection release/2.7.1's configs/faster_rcnn (copied unchanged under
tests/fixtures/paddle_configs) convert: the model sections, the backbone and neck they build
(trainable parameters equal PaddleDetection's own count, tests/fixtures/faster_rcnn/
param_counts.json by make_param_counts.py), the schedule; Swin refused in one line."""

import json
import os

import pytest
import yaml

from ppdist.components import build_model, build_postprocess
from ppdist.config import load_config
from ppdist.convert.configs.convert import convert_config
from ppdist.errors import ConfigError
from ppdist.modeling.architectures import BaseModel
from ppdist.registry import LOSSES, TRANSFORMS

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIGS = os.path.join(
    REPO, "tests", "fixtures", "paddle_configs", "PaddleDetection", "configs", "faster_rcnn"
)
with open(os.path.join(REPO, "tests", "fixtures", "faster_rcnn", "param_counts.json"), encoding="utf-8") as f:
    COUNTS = json.load(f)
NAMES = sorted(name for name in os.listdir(CONFIGS) if name.endswith(".yml"))
C4 = ("faster_rcnn_r50_1x_coco.yml", "faster_rcnn_r50_vd_1x_coco.yml", "faster_rcnn_r101_1x_coco.yml")
REFUSED = {
    "faster_rcnn_swin_tiny_fpn_1x_coco.yml": "FasterRCNN.backbone 'SwinTransformer'",
    "faster_rcnn_swin_tiny_fpn_2x_coco.yml": "FasterRCNN.backbone 'SwinTransformer'",
}


def trainable(module):
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def test_the_fixture_holds_every_release_config():
    assert len(NAMES) == 20 and set(COUNTS) == set(NAMES) - {n for n in NAMES if "swin" in n}


@pytest.mark.parametrize("name", NAMES)
def test_every_config_converts_or_is_refused_by_name(name):
    path = os.path.join(CONFIGS, name)
    if name in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[name]) as error:
            convert_config(path)
        assert "\n" not in str(error.value)
        return
    config = convert_config(path).config
    arch = config["Architecture"]
    assert arch["algorithm"] == "FasterRCNN" and arch["Head"]["name"] == "FasterRCNNHead"
    head = arch["Head"]
    assert config["Global"]["num_classes"] == 80 and config["PostProcess"]["name"] == "BBoxPostProcess"
    assert head["rpn_head"]["name"] == "RPNHead" and head["bbox_head"]["num_classes"] == 80
    if name in C4:  # no neck: res4's stride-16 map, Res5Head on 14x14 RoIs, pooled
        assert "Neck" not in arch and head["feat_strides"] == [16]
        assert head["bbox_head"]["head"] == {"name": "Res5Head"} and head["bbox_head"]["with_pool"] is True
        assert head["bbox_head"]["roi_extractor"]["resolution"] == 14
    else:
        assert head["feat_strides"] == [4, 8, 16, 32, 64]
        assert head["bbox_head"]["head"] == {"name": "TwoFCHead", "out_channel": 1024}
    body = BaseModel({"model_type": "det", "Backbone": arch["Backbone"], "Neck": arch.get("Neck")})
    assert trainable(body.backbone) == COUNTS[name]["backbone"]
    assert body.neck is None or trainable(body.neck) == COUNTS[name]["neck"]
    opt = config["Optimizer"]
    assert (opt["name"], opt["momentum"], opt["regularizer"]) == (
        "Momentum",
        0.9,
        {"name": "L2", "factor": 0.0001},
    )
    two_x = "2x" in name
    milestones = [12, 22] if "ssld_2x" in name else [16, 22] if two_x else [8, 11]  # the configs' own
    assert opt["lr"]["decay_epochs"] == milestones
    assert config["Global"]["epoch_num"] == (24 if two_x else 12)
    assert (opt["lr"]["warmup_iters"], opt["lr"]["warmup_start_lr"]) == (1000, pytest.approx(0.001))


def test_the_backbone_settings_of_each_family():
    def backbone(name):
        return convert_config(os.path.join(CONFIGS, name)).config["Architecture"]["Backbone"]

    assert backbone("faster_rcnn_x101_vd_64x4d_fpn_1x_coco.yml")["groups"] == 64
    assert backbone("faster_rcnn_x101_vd_64x4d_fpn_1x_coco.yml")["base_width"] == 4
    assert backbone("faster_rcnn_r50_vd_fpn_ssld_1x_coco.yml")["lr_mult_list"] == [0.05, 0.05, 0.1, 0.15]
    assert backbone("faster_rcnn_r34_vd_fpn_1x_coco.yml")["variant"] == "d"
    assert backbone("faster_rcnn_r101_fpn_1x_coco.yml")["depth"] == 101


def test_sync_bn_and_unknown_keys(tmp_path):
    path = tmp_path / "sync.yml"
    path.write_text(
        f"_BASE_: ['{os.path.join(CONFIGS, 'faster_rcnn_r50_fpn_1x_coco.yml')}']\n"
        "norm_type: sync_bn\nResNet: {depth: 50, frobnicate: 1}\n",
        encoding="utf-8",
    )
    conversion = convert_config(str(path))
    assert conversion.config["Global"]["use_sync_bn"] is True
    assert "norm_type" not in conversion.config["Architecture"]["Backbone"]
    assert any(line.startswith("ResNet.frobnicate") for line in conversion.unmapped)


@pytest.mark.parametrize("name", ["faster_rcnn_r50_vd_fpn_ssld_2x_coco.yml", "faster_rcnn_r50_1x_coco.yml"])
def test_converted_configs_validate_and_build(name, tmp_path):
    """The converted file loads with ppdist's validation and builds the model and post-process.
    Until the Faster R-CNN loss (``FasterRCNNLoss``) is registered, a stand-in Loss lets the other
    sections be validated."""
    config = convert_config(os.path.join(CONFIGS, name)).config
    if "FasterRCNNLoss" not in LOSSES:
        config["Loss"] = {"name": "CTCLoss"}
    path = tmp_path / "converted.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    loaded = load_config(str(path))
    model = build_model(loaded)
    assert type(model.head).__name__ == "FasterRCNNHead"
    assert type(build_postprocess(loaded)).__name__ == "BBoxPostProcess"
    assert trainable(model) == COUNTS[name]["total"]


@pytest.mark.parametrize(
    "name,weights",
    [
        ("faster_rcnn_x101_vd_64x4d_fpn_1x_coco.yml", "ResNeXt101_vd_64x4d_pretrained.pdparams"),
        ("faster_rcnn_r50_vd_fpn_ssld_1x_coco.yml", "ResNet50_vd_ssld_v2_pretrained.pdparams"),
    ],
)
def test_imagenet_pretrain_weights_go_to_the_backbone(name, weights, tmp_path):
    assert any(
        line.startswith("pretrain_weights") and "Architecture.Backbone.pretrained" in line
        for line in convert_config(os.path.join(CONFIGS, name)).unmapped
    )  # the release configs' URLs: download, then give the path
    (tmp_path / weights).write_bytes(b"")
    path = tmp_path / "local.yml"
    path.write_text(
        f"_BASE_: ['{os.path.join(CONFIGS, name)}']\npretrain_weights: {weights}\n", encoding="utf-8"
    )
    config = convert_config(str(path)).config
    assert config["Architecture"]["Backbone"]["pretrained"].endswith(weights)
    assert "pretrained_model" not in config["Global"]


def test_faster_fpn_reader_converts_and_builds():
    """faster_fpn_reader.yml's TrainReader: RandomResize (six [h, 1333] sizes, keep_ratio, cubic) maps to
    ppdist's RandomResize with those options; the EvalReader's Resize keeps keep_ratio and [800, 1333]."""
    result = convert_config(os.path.join(CONFIGS, "faster_rcnn_r50_fpn_1x_coco.yml"))
    train = result.config["Train"]["dataset"]["transforms"]
    assert [next(iter(op)) for op in train] == [
        "Decode",
        "RandomResize",
        "RandomFlip",
        "NormalizeImage",
        "Permute",
    ]
    options = train[1]["RandomResize"]
    assert options["target_size"] == [[s, 1333] for s in (640, 672, 704, 736, 768, 800)]
    assert (options["keep_ratio"], options["interp"]) == (True, 2)
    op = TRANSFORMS.build({"name": "RandomResize", **options})
    assert op.sizes == [(s, 1333) for s in (640, 672, 704, 736, 768, 800)] and op.interp == 2
    assert not op.random_interp and not op.random_range
    evaluation = result.config["Eval"]["dataset"]["transforms"]
    assert evaluation[1] == {"Resize": {"interp": 2, "target_size": [800, 1333], "keep_ratio": True}}
    # PaddleDetection's PadBatch, stride 32, joins the sizes; training pads the boxes too (PadGT: any
    # batch size trains, as PaddleDetection's per-image box lists)
    pad = {"PadBatch": {"pad_to_stride": 32}}
    assert result.config["Train"]["dataset"]["batch_transforms"] == [pad, {"PadGT": {}}]
    assert result.config["Eval"]["dataset"]["batch_transforms"] == [pad]
    assert any("PadGT appended" in note for note in result.notes)
    assert TRANSFORMS.build({"name": "PadBatch", "pad_to_stride": 32}).stride == 32
    assert not [u for u in result.unmapped if "RandomResize" in str(u) or "PadBatch" in str(u)]


def test_faster_reader_without_fpn_pads_without_rounding():
    """faster_reader.yml (the C4 configs) is the FPN reader with PadBatch pad_to_stride -1: no rounding."""
    config = convert_config(os.path.join(CONFIGS, "faster_rcnn_r50_1x_coco.yml")).config
    assert next(iter(config["Train"]["dataset"]["transforms"][1])) == "RandomResize"
    pad, boxes = config["Train"]["dataset"]["batch_transforms"]
    assert boxes == {"PadGT": {}}
    assert pad == {"PadBatch": {"pad_to_stride": -1}}
    assert TRANSFORMS.build({"name": "PadBatch", **pad["PadBatch"]}).stride == 0
