"""The shipped PP-YOLOE configs resolve to PaddleDetection's recipes and build the originals."""

import math
import os

import pytest

from ppdist import build_model, load_config
from ppdist.components import build_loss, build_postprocess
from ppdist.optim import build_optimizer

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DET = os.path.join(REPO, "configs", "det")


def cfg(name):
    return os.path.join(DET, name)


@pytest.mark.parametrize(
    "size,depth,width", [("s", 0.33, 0.50), ("m", 0.67, 0.75), ("l", 1.0, 1.0), ("x", 1.33, 1.25)]
)
def test_sizes_share_the_base_and_scale(size, depth, width):
    config = load_config(cfg(f"ppyoloe_crn_{size}_300e_coco.yml"))
    glob = config["Global"]
    assert (glob["depth_mult"], glob["width_mult"], glob["num_classes"], glob["epoch_num"]) == (
        depth,
        width,
        80,
        300,
    )
    assert glob["use_ema"] and glob["ema_decay_type"] == "threshold" and glob["use_sync_bn"]
    assert config["Train"]["loader"]["batch_size_per_card"] == 8


def test_s_recipe_builds_the_original_and_its_schedule():
    config = load_config(cfg("ppyoloe_crn_s_300e_coco.yml"))
    model = build_model(config)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 8_084_588
    loss = build_loss(config)
    assert loss.static_assigner_epoch == 100
    post = build_postprocess(config)
    assert (post.score_threshold, post.nms_top_k, post.nms_threshold, post.keep_top_k) == (
        0.01,
        1000,
        0.7,
        300,
    )
    steps = 1832  # COCO train2017 at a global batch of 64
    optimizer, scheduler = build_optimizer(config["Optimizer"], model, epochs=300, step_each_epoch=steps)
    schedule = scheduler.schedule
    assert schedule.lr_at(0) == 0.0 and schedule.lr_at(5 * steps) == pytest.approx(0.01)
    final = 0.01 * 0.5 * (1 + math.cos(math.pi * (300 - 5) / (360 - 5)))
    assert schedule.lr_at(300 * steps) == pytest.approx(final)  # ~0.069 x base: max_epochs 360 > 300
    decays = {g["weight_decay"] for g in optimizer.param_groups}
    assert decays == {0.0005, 0.0}  # BatchNorm parameters are not decayed
    no_decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    import torch

    bn_params = {
        id(p) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d) for p in m.parameters()
    }
    assert no_decay == bn_params


def test_plus_recipe_changes_only_its_keys():
    config = load_config(cfg("ppyoloe_plus_crn_s_80e_coco.yml"))
    assert config["Architecture"]["Backbone"]["use_alpha"] is True
    assert config["Loss"]["static_assigner_epoch"] == 30 and config["Global"]["epoch_num"] == 80
    assert (
        config["Optimizer"]["lr"]["learning_rate"] == 0.001 and config["Optimizer"]["lr"]["max_epochs"] == 96
    )
    norm = config["Train"]["dataset"]["batch_transforms"][1]["NormalizeImage"]
    assert norm["mean"] == [0.0, 0.0, 0.0] and norm["std"] == [1.0, 1.0, 1.0]
    model = build_model(config)
    assert any(name.endswith("alpha") for name, _ in model.named_parameters())
