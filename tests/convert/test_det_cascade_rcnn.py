"""PaddleDetection release/2.7.1's configs/cascade_rcnn (copied unchanged under
tests/fixtures/paddle_configs) convert and build Cascade R-CNN with PaddleDetection's trainable
parameter count (counted by PaddleDetection: tests/fixtures/paddle_step/cascade_rcnn_keys.json,
make_cascade_rcnn.py); its state dict converts whole; Cascade Mask R-CNN and the CascadeHead
settings ppdist does not reproduce are refused in one line."""

import json
import os

import pytest
import torch
import yaml
from faster_rcnn_testing import CASCADE_CONFIGS
from paddle_step_testing import to_torch

from ppdist.components import build_loss, build_model, build_postprocess
from ppdist.config import load_config
from ppdist.convert.configs.convert import convert_config
from ppdist.errors import ConfigError
from ppdist.modeling.heads.cascade_head import CascadeHead

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KEYS = os.path.join(REPO, "tests", "fixtures", "paddle_step", "cascade_rcnn_keys.json")
with open(KEYS, encoding="utf-8") as handle:
    PADDLE = json.load(handle)
NAMES = sorted(PADDLE["trainable"])
MASK = "cascade_mask_rcnn_r50_fpn_1x_coco.yml"


def test_the_fixture_holds_the_release_configs():
    found = sorted(name for name in os.listdir(CASCADE_CONFIGS) if name.endswith(".yml"))
    assert found == sorted(NAMES + [MASK])


@pytest.mark.parametrize("name", NAMES)
def test_each_config_builds_paddledetections_model(name, tmp_path):
    """Converted, written, loaded with ppdist's validation: the model has PaddleDetection's
    trainable count (69,119,246), the loss and the post-process take the cascade's settings."""
    config = convert_config(os.path.join(CASCADE_CONFIGS, name)).config
    path = tmp_path / "converted.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    loaded = load_config(str(path))
    head = loaded["Architecture"]["Head"]["bbox_head"]
    assert loaded["Architecture"]["algorithm"] == "CascadeRCNN"
    assert head["name"] == "CascadeHead" and head["head"] == {"name": "CascadeTwoFCHead", "out_channel": 1024}
    assert head["bbox_assigner"]["cascade_iou"] == [0.5, 0.6, 0.7]
    model = build_model(loaded)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == PADDLE["trainable"][name]
    loss = build_loss(loaded)
    assert type(loss).__name__ == "CascadeRCNNLoss"
    assert loss.stage_bbox_weight == [[10, 10, 5, 5], [20, 20, 10, 10], [30, 30, 15, 15]]
    assert loss.stage_loss_weights == pytest.approx([1 / 3] * 3)  # PaddleDetection's default
    assert build_postprocess(loaded).decode.prior_box_var == [30.0, 30.0, 15.0, 15.0]


def test_paddledetections_state_dict_converts_whole():
    """Every key of the model's state (88 trainable tensors of the box head stages included)."""
    config = convert_config(os.path.join(CASCADE_CONFIGS, PADDLE["config"])).config
    model = build_model(config)
    state = {k: torch.zeros(v).numpy() for k, v in PADDLE["shapes"].items()}
    converted = to_torch(model, state)
    assert set(converted) == set(model.state_dict())
    assert converted["head.bbox_head.head.2.fc6.weight"].shape == (1024, 256 * 7 * 7)
    assert converted["head.bbox_head.bbox_delta_stage1.weight"].shape == (4, 1024)


def test_cascade_mask_rcnn_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"CascadeRCNN\.mask_head 'MaskHead': mask heads") as error:
        convert_config(os.path.join(CASCADE_CONFIGS, MASK))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"add_gt_as_proposals": [True, True, False]}, "ground truth joins the proposals at stage 0 only"),
        ({"bbox_weight": [[10, 10, 5, 5]]}, "bbox_weight has 1 entries for 3 stages"),
        ({"stage_loss_weights": [1.0, 0.5]}, "stage_loss_weights has 2 entries for 3 stages"),
        ({"bbox_loss": {"name": "GIoULoss"}}, "bbox_loss is not supported"),
        ({"loss_normalize_pos": True}, "loss_normalize_pos true is not supported"),
    ],
)
def test_settings_ppdist_does_not_reproduce_are_refused(settings, message):
    with pytest.raises(ValueError, match=message) as error:
        CascadeHead(feat_channel=8, head={"name": "CascadeTwoFCHead", "out_channel": 16}, **settings)
    assert "\n" not in str(error.value)


def test_a_changed_stage_loss_weights_reaches_the_loss(tmp_path):
    path = tmp_path / "weights.yml"
    path.write_text(
        f"_BASE_: ['{os.path.join(CASCADE_CONFIGS, PADDLE['config'])}']\n"
        "CascadeHead: {stage_loss_weights: [1.0, 0.5, 0.25]}\n",
        encoding="utf-8",
    )
    config = convert_config(str(path)).config
    assert config["Loss"]["stage_loss_weights"] == [1.0, 0.5, 0.25]


def test_two_stages_take_the_first_two_box_weights(tmp_path):
    """As PaddleDetection, ``num_cascade_stages: 2`` reads the first two of the default three
    ``bbox_weight`` entries (and ``cascade_iou`` / ``add_gt_as_proposals`` values)."""
    path = tmp_path / "two.yml"
    path.write_text(
        f"_BASE_: ['{os.path.join(CASCADE_CONFIGS, PADDLE['config'])}']\n"
        "CascadeHead: {num_cascade_stages: 2}\nCascadeTwoFCHead: {num_cascade_stage: 2}\n",
        encoding="utf-8",
    )
    config = convert_config(str(path)).config
    assert config["Loss"]["bbox_weight"] == [[10, 10, 5, 5], [20, 20, 10, 10]]
    model = build_model(config)
    assert sorted(model.head.bbox_head.head._modules) == ["0", "1"]
    assert build_loss(config).stage_loss_weights == [0.5, 0.5]
