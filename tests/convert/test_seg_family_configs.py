"""PaddleSeg's SegFormer and OCRNet configs (copied unchanged under tests/fixtures/paddle_configs)
convert to the Architecture / Loss / Optimizer / PostProcess of the issue-30 contract, or are
refused in one line that names the key ppdist does not have."""

import glob
import os
import re

import pytest
import torch

from ppdist.convert.configs.convert import convert_config
from ppdist.convert.configs.paddleseg import load_seg_yaml
from ppdist.errors import ConfigError
from ppdist.registry import BACKBONES, HEADS

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
UPSTREAM = os.path.join(REPO, "tests", "fixtures", "paddle_configs", "PaddleSeg", "configs")
SEGFORMER = sorted(glob.glob(os.path.join(UPSTREAM, "segformer", "segformer_b*_cityscapes_*.yml")))
OCRNET = sorted(glob.glob(os.path.join(UPSTREAM, "ocrnet", "ocrnet_hrnetw*.yml")))
B0 = os.path.join(UPSTREAM, "segformer", "segformer_b0_cityscapes_1024x1024_160k.yml")
W18 = os.path.join(UPSTREAM, "ocrnet", "ocrnet_hrnetw18_cityscapes_1024x512_160k.yml")
REFUSED = {
    "ocrnet_hrnetw18_cityscapes_1024x512_160k_lovasz_softmax.yml": (
        r"loss\.types\[0\]: loss type 'MixedLoss' of CrossEntropyLoss \+ LovaszSoftmaxLoss is not supported"
    ),
    "ocrnet_hrnetw48_cityscapes_1024x512_40k_SCL.yml": (
        r"loss\.types\[0\]: loss type 'MixedLoss' of CrossEntropyLoss \+ SemanticConnectivityLoss is not supported"
    ),
    "ocrnet_hrnetw18_road_extraction_768x768_15k.yml": (
        r"train_dataset\.type 'MiniDeepGlobeRoadExtraction' is not supported"
    ),
    "ocrnet_hrnetw18_road_extraction_768x768_15k_lovasz_hinge.yml": (
        r"train_dataset\.type 'MiniDeepGlobeRoadExtraction' is not supported"
    ),
    "ocrnet_hrnetw18_voc12aug_512x512_40k.yml": r"train_dataset\.type 'PascalVOC' is not supported",
    "ocrnet_hrnetw48_voc12aug_512x512_40k.yml": r"train_dataset\.type 'PascalVOC' is not supported",
}
CE = {"name": "CrossEntropyLoss"}


def test_every_upstream_config_is_copied():
    assert len(SEGFORMER) == 12 and len(OCRNET) == 9


@pytest.mark.parametrize("path", SEGFORMER, ids=os.path.basename)
def test_segformer_configs_convert(path):
    b, crop = re.match(r"segformer_b(\d)_cityscapes_(\d+x\d+)_160k", os.path.basename(path)).groups()
    conversion = convert_config(path)
    config = conversion.config
    assert config["Architecture"] == {
        "model_type": "seg",
        "algorithm": "SegFormer",
        "Backbone": {"name": f"MixVisionTransformer_B{b}"},
        "Head": {"name": "SegFormerHead", "embedding_dim": 256 if b in "01" else 768},
    }
    assert config["Optimizer"] == {
        "name": "AdamW",
        "beta1": 0.9,
        "beta2": 0.999,
        "weight_decay": 0.01,  # `_inherited_: False` drops the base's momentum and 4e-5
        "lr": {"name": "PolynomialDecay", "learning_rate": 6e-05, "end_lr": 0.0, "power": 1.0},
    }
    assert any(
        note.startswith("Optimizer AdamW: decoupled weight decay on every parameter")
        for note in conversion.notes
    )
    assert config["Loss"] == {"name": "MultiOutputLoss", "types": [CE], "coef": [1]}
    slide = {"is_slide": True, "crop_size": [1024, 1024], "stride": [768, 768]} if crop == "1024x1024" else {}
    assert config["PostProcess"] == {"name": "SegPostProcess", **slide}
    w, h = (int(v) for v in crop.split("x"))
    assert {"RandomPaddingCrop": {"crop_size": [w, h]}} in config["Train"]["dataset"]["transforms"]
    assert config["Train"]["loader"]["batch_size_per_card"] == load_seg_yaml(path)["batch_size"]
    assert config["Global"]["max_iters"] == 160000 and config["Global"]["num_classes"] == 19
    assert [item.split(" ")[0] for item in conversion.unmapped] == ["model.backbone.pretrained"]


@pytest.mark.parametrize("path", OCRNET, ids=os.path.basename)
def test_ocrnet_configs_convert_or_name_what_ppdist_lacks(path):
    name = os.path.basename(path)
    if name in REFUSED:
        with pytest.raises(ConfigError, match=REFUSED[name]) as info:
            convert_config(path)
        assert "\n" not in str(info.value) and path in str(info.value)
        return
    width, iters = re.match(r"ocrnet_hrnet(w\d+)_cityscapes_1024x512_(\d+)k\.yml", name).groups()
    conversion = convert_config(path)
    config = conversion.config
    assert config["Architecture"] == {
        "model_type": "seg",
        "algorithm": "OCRNet",
        "Backbone": {"name": f"HRNet_{width.upper()}"},
        "Head": {"name": "OCRHead", "backbone_indices": [0]},
    }
    assert config["Loss"] == {"name": "MultiOutputLoss", "types": [CE, CE], "coef": [1, 0.4]}
    assert config["Optimizer"] == {  # type SGD + the base's momentum: PaddleSeg's Momentum
        "name": "Momentum",
        "momentum": 0.9,
        "weight_decay": 4e-05,
        "lr": {"name": "PolynomialDecay", "learning_rate": 0.01, "end_lr": 0.0, "power": 0.9},
    }
    assert config["PostProcess"] == {"name": "SegPostProcess"}
    assert config["Global"]["max_iters"] == int(iters) * 1000
    assert {"RandomPaddingCrop": {"crop_size": [1024, 512]}} in config["Train"]["dataset"]["transforms"]
    assert [item.split(" ")[0] for item in conversion.unmapped] == ["model.backbone.pretrained"]
    assert f"hrnet_{width}_ssld.tar.gz" in conversion.unmapped[0]


def test_segformer_b0_1024x1024_data_and_test_config():
    config = convert_config(B0).config
    assert config["Train"]["dataset"]["transforms"] == [
        {"ResizeStepScaling": {"min_scale_factor": 0.5, "max_scale_factor": 2.0, "scale_step_size": 0.25}},
        {"RandomPaddingCrop": {"crop_size": [1024, 1024]}},
        {"RandomHorizontalFlip": {}},
        {"RandomDistort": {"brightness_range": 0.4, "contrast_range": 0.4, "saturation_range": 0.4}},
        {"Normalize": {}},
    ]
    assert config["Eval"]["dataset"] == {
        "name": "CityscapesDataSet",
        "dataset_root": "data/cityscapes",
        "transforms": [{"Normalize": {}}],
    }
    assert config["Train"]["loader"]["batch_size_per_card"] == 2
    assert config["Eval"]["loader"]["batch_size_per_card"] == 1


def _child(tmp_path, base, text):
    path = tmp_path / "child.yml"
    path.write_text(f"_base_: {base}\n{text}")
    return str(path)


def test_optional_model_and_backbone_arguments_pass_through(tmp_path):
    ocr = convert_config(
        _child(
            tmp_path,
            W18,
            "model:\n  ocr_mid_channels: 256\n  align_corners: True\n"
            "  backbone: {has_se: True, padding_same: False, use_psa: True}\n",
        )
    )
    arch = ocr.config["Architecture"]
    assert arch["Backbone"] == {"name": "HRNet_W18", "has_se": True, "padding_same": False}
    assert arch["Head"] == {
        "name": "OCRHead",
        "backbone_indices": [0],
        "ocr_mid_channels": 256,
        "align_corners": True,
    }
    assert any(item.startswith("model.backbone.use_psa") for item in ocr.unmapped)
    seg = convert_config(
        _child(
            tmp_path, B0, "model:\n  backbone: {drop_path_rate: 0.2, attn_drop_rate: 0.1, qk_scale: 0.5}\n"
        )
    )
    backbone = seg.config["Architecture"]["Backbone"]
    assert backbone == {"name": "MixVisionTransformer_B0", "attn_drop_rate": 0.1, "drop_path_rate": 0.2}
    assert any(item.startswith("model.backbone.qk_scale") for item in seg.unmapped)


@pytest.mark.parametrize(
    "base,text,match",
    [
        (B0, "model: {embedding_dim: null}\n", r"model\.embedding_dim is required for model type SegFormer"),
        (
            W18,
            "model: {backbone_indices: null}\n",
            r"model\.backbone_indices is required for model type OCRNet",
        ),
        (B0, "model: {backbone: {type: HRNet_W18}}\n", r"model\.backbone\.type 'HRNet_W18' is not supported"),
        (W18, "model: {backbone: {type: HRNet_W18_Small_V3}}\n", r"HRNet_W18_Small_V1, HRNet_W18_Small_V2"),
        (W18, "model: {num_classes: 21}\n", r"model\.num_classes 21 differs from the train_dataset's 19"),
    ],
)
def test_bad_model_sections_fail_in_one_line(tmp_path, base, text, match):
    path = _child(tmp_path, base, text)
    with pytest.raises(ConfigError, match=match) as info:
        convert_config(path)
    assert "\n" not in str(info.value) and path in str(info.value)


# ------------------------------------------------------- with the models (on once they are registered)
def _needs(*names):
    missing = [n for n in names if n not in BACKBONES and n not in HEADS]
    if missing:
        pytest.skip(f"not registered yet: {', '.join(missing)}")


@pytest.mark.parametrize(
    "path,names,params,optimizer,decay",
    [  # trainable parameters: Paddle's count of PaddleSeg d7975e7c's model
        (B0, ("MixVisionTransformer_B0", "SegFormerHead"), 3_719_027, torch.optim.AdamW, 0.01),
        (W18, ("HRNet_W18", "OCRHead"), 12_083_122, torch.optim.SGD, 4e-5),
    ],
    ids=["segformer_b0", "ocrnet_hrnetw18"],
)
def test_converted_configs_build_the_original_models_and_decay_every_parameter(
    path, names, params, optimizer, decay
):
    _needs(*names)
    from ppdist import build_model, load_config
    from ppdist.optim import build_optimizer

    config = load_config(path)
    model = build_model(config)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == params
    built, _ = build_optimizer(
        config["Optimizer"], model, epochs=1, step_each_epoch=160000, total_steps=160000
    )
    assert type(built) is optimizer
    decayed = {
        id(p) for group in built.param_groups if group["weight_decay"] == decay for p in group["params"]
    }
    assert decayed == {id(p) for p in trainable}  # PaddleSeg: norms and biases too


@pytest.mark.parametrize(
    "paddle,ours,names",
    [
        (B0, "segformer_b0_cityscapes_1024x1024_160k.yml", ("MixVisionTransformer_B0", "SegFormerHead")),
        (W18, "ocrnet_hrnetw18_cityscapes_1024x512_160k.yml", ("HRNet_W18", "OCRHead")),
    ],
)
def test_the_recipes_equal_the_converted_upstream_configs(paddle, ours, names):
    _needs(*names)
    from ppdist import load_config

    a, b = load_config(paddle), load_config(os.path.join(REPO, "configs", "seg", ours))
    for section in ("Architecture", "Loss", "Optimizer", "PostProcess", "Metric"):
        assert a[section] == b[section], section
    for section in ("Train", "Eval"):
        assert a[section]["dataset"]["transforms"] == b[section]["dataset"]["transforms"], section
        assert a[section]["loader"]["batch_size_per_card"] == b[section]["loader"]["batch_size_per_card"]
    for key in ("max_iters", "num_classes", "ignore_index", "use_sync_bn", "eval_batch_step"):
        assert a["Global"][key] == b["Global"][key], key
