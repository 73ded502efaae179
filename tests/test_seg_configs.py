"""The shipped PP-LiteSeg configs resolve to PaddleSeg's recipes and build the original models."""

import os

import pytest

from ppdist import build_model, load_config
from ppdist.components import build_loss, build_postprocess
from ppdist.engine.optim import build_optimizer
from ppdist.errors import ConfigError

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
