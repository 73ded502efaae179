"""The shipped PP-LiteSeg configs resolve to PaddleSeg's recipes and build the original models."""

import os

import pytest

from ppdist import build_model, load_config
from ppdist.components import build_loss, build_postprocess
from ppdist.errors import ConfigError
from ppdist.optim import build_optimizer

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
T_CFG = os.path.join(REPO, "configs", "seg", "pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml")
B_CFG = os.path.join(REPO, "configs", "seg", "pp_liteseg_stdc2_cityscapes_1024x512_scale0.5_160k.yml")


@pytest.mark.parametrize("path,backbone,params", [(T_CFG, "STDC1", 8_141_600), (B_CFG, "STDC2", 12_366_464)])
def test_cityscapes_recipe_resolves(path, backbone, params):
    config = load_config(path)
    glob = config["Global"]
    assert glob["max_iters"] == 160000 and glob["num_classes"] == 19 and glob["use_sync_bn"]
    assert config["Train"]["loader"]["batch_size_per_card"] == 4
    assert config["Train"]["dataset"]["transforms"][0]["ResizeStepScaling"]["min_scale_factor"] == 0.125
    model = build_model(config)
    assert config["Architecture"]["Backbone"]["name"] == backbone
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == params
    loss = build_loss(config)
    assert [(part.thresh, part.min_kept, part.ignore_index) for part in loss.losses] == [
        (0.7, 130000, 255)
    ] * 3
    post = build_postprocess(config)
    assert post.aug_eval and post.scales == [0.5]
    optimizer, scheduler = build_optimizer(
        config["Optimizer"], model, epochs=860, step_each_epoch=186, total_steps=160000
    )
    assert optimizer.param_groups[0]["weight_decay"] == 5e-4 and optimizer.param_groups[0]["momentum"] == 0.9
    assert scheduler.schedule.lr_at(0) == pytest.approx(1e-5)
    assert scheduler.schedule.lr_at(1000) == pytest.approx(0.005)
    assert scheduler.schedule.decay_steps == 159000


def test_misspelled_loss_entry_key_is_reported_with_its_path():
    with pytest.raises(ConfigError, match=r"Loss.types\[1\].*min_kep"):
        load_config(T_CFG, ["Loss.types.1.min_kep=5"])


def test_global_num_classes_reaches_every_component():
    config = load_config(
        os.path.join(REPO, "configs", "seg", "quickstart_synth.yml"),
        ["Global.num_classes=3", "Global.synthetic_data.num_classes=3"],
    )
    model = build_model(config)
    assert model.head.seg_heads[0].conv_out.out_channels == 3
    from ppdist.components import build_metric

    assert build_metric(config).num_classes == 3


FAMILY_QUICKSTARTS = {  # trainable parameters at 5 classes: the recipes' 19-class counts less the classifiers'
    "segformer": ("quickstart_segformer_synth.yml", "segformer_b0_cityscapes_1024x1024_160k.yml", 3_715_429),
    "ocrnet": ("quickstart_ocrnet_synth.yml", "ocrnet_hrnetw18_cityscapes_1024x512_160k.yml", 12_072_146),
}


@pytest.mark.parametrize("family", sorted(FAMILY_QUICKSTARTS))
def test_family_quickstarts_train_the_recipes_model_loss_and_optimizer_on_synthetic_data(family):
    """The SegFormer / OCRNet quick starts change only the data, its class count, the schedule and
    the peak LR (with a warm-up) of their recipes."""
    quick_name, recipe_name, params = FAMILY_QUICKSTARTS[family]
    quick, recipe = (
        load_config(os.path.join(REPO, "configs", "seg", name)) for name in (quick_name, recipe_name)
    )
    assert quick["Architecture"] == recipe["Architecture"]
    assert quick["Loss"] == recipe["Loss"]
    assert quick["Metric"] == recipe["Metric"]
    same = {key: value for key, value in recipe["Optimizer"].items() if key != "lr"}
    assert {key: quick["Optimizer"][key] for key in same} == same
    lr, recipe_lr = quick["Optimizer"]["lr"], recipe["Optimizer"]["lr"]
    assert lr["name"] == recipe_lr["name"] == "PolynomialDecay" and lr["power"] == recipe_lr["power"]
    assert lr["learning_rate"] > recipe_lr["learning_rate"] and lr["warmup_iters"] > 0
    assert quick["Global"]["num_classes"] == quick["Global"]["synthetic_data"]["num_classes"] == 5
    assert quick["Train"]["dataset"]["dataset_root"] == quick["Global"]["synthetic_data"]["data_dir"]
    names = [next(iter(t)) for t in quick["Train"]["dataset"]["transforms"]]
    assert names == [next(iter(t)) for t in recipe["Train"]["dataset"]["transforms"]]
    assert sum(p.numel() for p in build_model(quick).parameters() if p.requires_grad) == params
    post = build_postprocess(quick)
    assert post.is_slide == build_postprocess(recipe).is_slide  # the recipe's evaluation, scaled down
