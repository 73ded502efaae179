"""PaddleDetection PP-YOLOE weights -> ppdist: complete conversion and the original's outputs.

The fixtures (tests/fixtures/paddle_det, written by its make_fixtures.py with paddlepaddle 3.3.1
and PaddleDetection's own cspresnet / custom_pan / ppyoloe_head modules) hold two scaled-down
detectors saved by ``paddle.save`` and the original's eval-mode post-process output before NMS
(``exclude_nms``): boxes on the original images (divided by ``scale_factor``) and sigmoid scores.

* ``ppyoloe_tiny``: PP-YOLOE, width 0.0625, depth 0.33, 5 classes;
* ``ppyoloe_plus_tiny``: PP-YOLOE+ (RepVgg alpha), width 0.0625, depth 0.67 (the neck's SPP
  between two blocks), 5 classes.

The original's outputs were computed in float64 (same float32 weights) and in float32. The
fixtures' weights give realistic outputs (DFL distributions peaked around 0.5-3 bins, boxes of
23-190 px for the 96x128 input, scale factors 1 and 0.8 / 1.25). ppdist in float64 matches the
float64 outputs to ~2e-11 px (boxes) and ~1e-12 (scores); the tolerance here is 1e-8 (in
ppyoloe_tiny / ppyoloe_plus_tiny, a PyTorch-slope hard-sigmoid in the ESE gates gives 5.9e-6 /
1.4e-6 px, BatchNorm eps 1e-3 5.8e-2 / 2.7e-2 px, grid_cell_offset 0 20 px). ppdist in float32
matches the float32 outputs to 1e-4 (measured: boxes <= 3.8e-5 px, where float32 spacing is
1.5e-5 at 128-256 px; scores <= 1.2e-6; the original's own float32 boxes are 2.6e-5 / 3.5e-5 px
from its float64 ones). No Paddle is needed.
"""

import json
import os

import numpy as np
import pytest
import torch
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir, paddle_fixture_script

from ppdist.components import build_model, build_postprocess
from ppdist.config import load_config
from ppdist.convert.weights import convert_state_dict, load_paddle_weights
from ppdist.convert.weights.pdparams import load_pdparams
from ppdist.modeling.backbones.cspresnet import RepVggBlock
from ppdist.modeling.deploy import convert_to_deploy
from ppdist.tasks.det import DetDeploy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = paddle_fixture_dir("det")
CONFIGS = {
    False: os.path.join(ROOT, "configs", "det", "ppyoloe_crn_s_300e_coco.yml"),
    True: os.path.join(ROOT, "configs", "det", "ppyoloe_plus_crn_s_80e_coco.yml"),
}
TOL = 1e-4  # boxes (px) and scores in float32
TOL64 = 1e-8  # boxes and scores in float64

FX = paddle_fixture_script("det")
NAMES = list(FX.FIXTURES)


def fixture_model(name, num_classes=FX.NUM_CLASSES, use_alpha=None, depth_mult=None):
    """The ppdist model of fixture ``name``, from the det config with its settings."""
    settings = FX.FIXTURES[name]
    use_alpha = settings["use_alpha"] if use_alpha is None else use_alpha
    config = load_config(
        CONFIGS[use_alpha],
        [
            f"Global.width_mult={settings['width_mult']}",
            f"Global.depth_mult={settings['depth_mult'] if depth_mult is None else depth_mult}",
            f"Global.num_classes={num_classes}",
        ],
    )
    return build_model(config), config


def pdparams(name):
    return os.path.join(FIXTURES, f"{name}.pdparams")


def reference(name):
    return paddle_fixture_arrays("det", name)


def converted(name):
    model, config = fixture_model(name)
    state, report = load_paddle_weights(model, pdparams(name))
    model.load_state_dict(state, strict=True)
    model.eval()
    return model, config, report


def predict(model, config, expected, dtype):
    """ppdist's decoded boxes and scores before NMS (the exported graph's ``exclude_nms`` outputs)."""
    deploy = DetDeploy(model, build_postprocess(config), exclude_nms=True).eval().to(dtype)
    with torch.no_grad():
        boxes, scores = deploy(
            torch.from_numpy(expected["image"]).to(dtype),
            torch.from_numpy(expected["scale_factor"]).to(dtype),
        )
    return boxes.numpy(), scores.numpy()


def max_diff(value, expected):
    assert value.shape == expected.shape
    return float(np.abs(value.astype(np.float64) - expected).max())


def assert_complete(report, paddle_state):
    assert report.missing == [] and report.skipped == [], report.lines()
    assert report.unused == [], report.lines()  # yolo_head.proj_conv.weight: checked as a constant
    assert report.complete and len(report.loaded) == report.total == len(paddle_state) - 1


def check_float64(name, model, config, expected):
    """ppdist in float64 against the original's float64 outputs (the same float32 weights)."""
    boxes, scores = predict(model.double(), config, expected, torch.float64)
    diffs = {
        "boxes": max_diff(boxes, expected["boxes_fp64"]),
        "scores": max_diff(scores, expected["scores_fp64"]),
    }
    print(f"{name} float64: max abs diff boxes {diffs['boxes']:.2e} px, scores {diffs['scores']:.2e}")
    assert diffs["boxes"] <= TOL64 and diffs["scores"] <= TOL64
    return diffs


def check_float32(name, model, config, expected):
    """ppdist in float32 against the original's float32 outputs: boxes and scores to TOL."""
    boxes, scores = predict(model.float(), config, expected, torch.float32)
    diffs = {"boxes": max_diff(boxes, expected["boxes"]), "scores": max_diff(scores, expected["scores"])}
    print(
        f"{name} float32: max abs diff boxes {diffs['boxes']:.2e} px, scores {diffs['scores']:.2e} (the float32 "
        f"original vs the float64 one: boxes {max_diff(expected['boxes'], expected['boxes_fp64']):.2e} px)"
    )
    assert diffs["boxes"] <= TOL and diffs["scores"] <= TOL
    return diffs


@pytest.mark.parametrize("name", NAMES)
def test_conversion_is_complete(name):
    model, _ = fixture_model(name)
    paddle_state = load_pdparams(pdparams(name))
    _, report = convert_state_dict(model, paddle_state, name)
    assert_complete(report, paddle_state)
    alphas = [key for key in report.loaded if key.endswith(".alpha")]
    assert bool(alphas) == FX.FIXTURES[name]["use_alpha"]
    if (
        FX.FIXTURES[name]["depth_mult"] > 0.5
    ):  # the SPP between the neck's blocks: convs.0, convs.spp, convs.1
        assert "neck.fpn_stages.0.0.convs.1.conv1.conv.weight" in report.loaded


@pytest.mark.parametrize("name", NAMES)
def test_outputs_match_paddle(name):
    model, config, _ = converted(name)
    expected = reference(name)
    with torch.no_grad():  # the neck's outputs, float64
        feats = model.double().neck(model.backbone(torch.from_numpy(expected["image"]).double()))
    for i, feat in enumerate(feats):
        assert max_diff(feat.numpy(), expected[f"neck_out_{i}"]) <= TOL64
    check_float64(name, model, config, expected)
    check_float32(name, model, config, expected)
    # the fixture is not degenerate: spread scores, boxes of many sizes
    scores = expected["scores"]
    assert scores.min() < 0.01 and scores.max() > 0.9 and 0.15 < scores.mean() < 0.4
    widths = expected["boxes"][..., 2] - expected["boxes"][..., 0]
    assert widths.min() > 0 and widths.max() > 5 * widths.min()


@pytest.mark.parametrize("name", NAMES)
def test_deploy_model_matches_paddle(name):
    """RepVgg branches folded (in the precision the model runs in) give the original's outputs."""
    expected = reference(name)
    for dtype, check in ((torch.float64, check_float64), (torch.float32, check_float32)):
        model, config, _ = converted(name)
        convert_to_deploy(model.to(dtype))
        blocks = [m for m in model.modules() if isinstance(m, RepVggBlock)]
        assert blocks and all(block.conv is not None and block.alpha is None for block in blocks)
        check(f"{name} deploy", model, config, expected)


def test_class_count_change_is_skipped_and_listed():
    model, _ = fixture_model("ppyoloe_tiny", num_classes=7)
    paddle_state = load_pdparams(pdparams("ppyoloe_tiny"))
    state, report = convert_state_dict(model, paddle_state, "ppyoloe_tiny")
    skipped = sorted(entry.split(":")[0] for entry in report.skipped)
    assert skipped == sorted(f"head.pred_cls.{i}.{leaf}" for i in range(3) for leaf in ("weight", "bias"))
    assert "(5, 48, 3, 3)" in " ".join(report.skipped) and "(7, 48, 3, 3)" in " ".join(report.skipped)
    assert report.missing == [] and report.unused == [] and not report.complete
    assert len(report.loaded) == report.total - 6
    before = {key: value.clone() for key, value in model.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert sorted(missing) == skipped and unexpected == []
    assert torch.equal(model.state_dict()["head.pred_cls.0.bias"], before["head.pred_cls.0.bias"])
    assert torch.equal(
        model.state_dict()["head.pred_reg.0.bias"],
        torch.from_numpy(paddle_state["yolo_head.pred_reg.0.bias"]),
    )


def test_weights_without_alpha_leave_alpha_at_one():
    """PP-YOLOE+ fine-tuning from a detector trained without alpha (the Objects365 weights)."""
    model, _ = fixture_model("ppyoloe_tiny", use_alpha=True)
    paddle_state = load_pdparams(pdparams("ppyoloe_tiny"))
    _, report = convert_state_dict(model, paddle_state, "ppyoloe_tiny")
    assert report.missing and all(key.endswith(".conv2.alpha") for key in report.missing)
    assert report.skipped == [] and report.unused == []
    assert len(report.missing) == sum(
        1 for m in model.modules() if isinstance(m, RepVggBlock) and m.alpha is not None
    )


def test_dfl_projection_is_checked():
    model, _ = fixture_model("ppyoloe_tiny")
    paddle_state = load_pdparams(pdparams("ppyoloe_tiny"))
    np.testing.assert_array_equal(paddle_state["yolo_head.proj_conv.weight"].reshape(-1), np.arange(17))
    paddle_state["yolo_head.proj_conv.weight"] = paddle_state["yolo_head.proj_conv.weight"] * 2
    _, report = convert_state_dict(model, paddle_state, "ppyoloe_tiny")
    assert len(report.skipped) == 1 and report.skipped[0].startswith("head.proj:")
    assert "yolo_head.proj_conv.weight" in report.skipped[0] and report.unused == [] and not report.complete


def test_backbone_only_file_without_prefix():
    """PaddleDetection's ImageNet CSPResNet weights (CSPResNetb_s_pretrained.pdparams) name the
    backbone's tensors without ``backbone.``; ``stage="backbone"`` finds every one of them."""
    model, _ = fixture_model("ppyoloe_plus_tiny")
    paddle_state = load_pdparams(pdparams("ppyoloe_plus_tiny"))
    imagenet = {
        key[len("backbone.") :]: value for key, value in paddle_state.items() if key.startswith("backbone.")
    }
    assert "stem.conv1.conv.weight" in imagenet and "stages.0.blocks.0.conv2.alpha" in imagenet
    state, report = convert_state_dict(model, imagenet, "CSPResNet_pretrained", stage="backbone")
    backbone_keys = [key for key in model.backbone.state_dict() if not key.endswith("num_batches_tracked")]
    assert report.missing == [] and report.skipped == [] and report.unused == [], report.lines()
    assert sorted(report.loaded) == sorted(backbone_keys) and report.total == len(imagenet)
    full, _ = convert_state_dict(model, paddle_state, "ppyoloe_plus_tiny")
    for key in backbone_keys:
        assert torch.equal(state[key], full[f"backbone.{key}"]), key
    model.backbone.load_state_dict(state, strict=True)
    # the whole detector's file works for stage="backbone" too; its neck and head tensors are unused
    _, report = convert_state_dict(model, paddle_state, "ppyoloe_plus_tiny", stage="backbone")
    assert report.missing == [] and report.skipped == [] and len(report.loaded) == len(backbone_keys)
    assert report.unused and all(not key.startswith("backbone.") for key in report.unused)


@pytest.mark.parametrize("name", ["ppyoloe_crn_s", "ppyoloe_plus_crn_l"])
def test_real_size_names_and_counts(name):
    """Every tensor of the real-size models is found under its PaddleDetection name and shape."""
    with open(os.path.join(FIXTURES, "real_size_keys.json")) as f:
        entry = json.load(f)[name]
    config = load_config(
        CONFIGS[entry["use_alpha"]],
        [f"Global.width_mult={entry['width_mult']}", f"Global.depth_mult={entry['depth_mult']}"],
    )
    model = build_model(config)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == entry["trainable"]
    paddle_state = {key: np.zeros(shape, np.float32) for key, shape in entry["tensors"].items()}
    paddle_state["yolo_head.proj_conv.weight"] = np.arange(17, dtype=np.float32).reshape(1, 17, 1, 1)
    _, report = convert_state_dict(model, paddle_state, name)
    assert_complete(report, paddle_state)
