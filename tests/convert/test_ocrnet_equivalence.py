"""PaddleSeg OCRNet-HRNet weights -> ppdist: complete conversion and the original's outputs.

The fixtures (tests/fixtures/paddle_ocrnet, written by its make_fixtures.py with paddlepaddle 2.6.2
and PaddleSeg's own ``OCRNet`` / ``HRNet_*``) hold seeded weights (re-created here from the seed and
the manifest of Paddle names and shapes), calibrated BatchNorm statistics and the original's outputs
on a 1x3x34x42 input: eval logits (and the head's two outputs before upsampling), the same in
float64, and the train-mode [main, soft regions] (Dropout2d at 0 on both sides), in float32 and in
float64. No Paddle is needed. Measured max abs differences (torch CPU; ``pytest -s`` prints them):

* ``ocrnet_hrnetw18`` (real size, the cityscapes config): float32 eval logits 8.7e-4 (logits up
  to 37.4; Paddle's own float32 logits are 4.2e-4 from its float64 ones), soft regions 6.2e-5,
  train mode 1.7e-3 (BatchNorm on the statistics of a 2x2 map); float64: eval 3.0e-5, train-mode
  head 2.9e-5;
* ``ocrnet_hrnet_small_v1_se`` (SE blocks, padding 1, align_corners, two backbone_indices):
  float32 eval 4.5e-6, train 2.2e-4 (logits up to 3.0); float64: eval 1.5e-6, train-mode head 5.4e-7.

The real-size float32 differences are rounding noise, not a model difference: the float64 runs of
the same weights agree to ~1e-6 of the logits' range (what is left is Paddle's bilinear kernel,
which computes its source coordinates in float32 even on float64 tensors).
"""

import copy
import json
import os
from typing import Dict, Optional, Tuple

import numpy as np
import pytest
import torch
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir, paddle_fixture_script

import ppdist.components  # noqa: F401  (registers the stages)
from ppdist.convert.weights import convert_state_dict
from ppdist.convert.weights.naming import paddle_candidates, stage_renames
from ppdist.modeling.architectures import BaseModel

NAME = "ocrnet_hrnetw18"
SMALL = "ocrnet_hrnet_small_v1_se"
FX = paddle_fixture_script("ocrnet")


def build(settings: dict, num_classes: Optional[int] = None) -> BaseModel:
    """The ppdist model of a fixture's settings (PaddleSeg's backbone and OCRNet arguments)."""
    head = {"name": "OCRHead", "num_classes": num_classes or settings["num_classes"], **settings["Head"]}
    return BaseModel({"model_type": "seg", "Backbone": dict(settings["Backbone"]), "Head": head})


def load_fixture(name: str) -> Tuple[dict, Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """(settings, the Paddle state dict: seeded weights + the stored statistics, the stored arrays)."""
    with open(os.path.join(paddle_fixture_dir("ocrnet"), f"{name}.json")) as f:
        settings = json.load(f)
    expected = paddle_fixture_arrays("ocrnet", name)
    state = FX.synthetic_state(settings["tensors"], settings["seed"])
    statistics = {key[len("state/") :]: value for key, value in expected.items() if key.startswith("state/")}
    assert statistics and set(statistics) <= set(state)
    state.update(statistics)
    return settings, state, expected


def max_diff(actual, expected) -> float:
    actual = actual.numpy() if isinstance(actual, torch.Tensor) else actual
    assert actual.shape == expected.shape
    return float(np.abs(actual - expected).max())


@pytest.fixture(scope="module")
def w18():
    return load_fixture(NAME)


@pytest.fixture(scope="module")
def expected(w18):
    return w18[2]


@pytest.fixture(scope="module")
def paddle_state(w18):
    return w18[1]


@pytest.fixture(scope="module")
def converted(w18):
    """(the ppdist model with the converted weights, in eval mode; the conversion report)."""
    settings, paddle_state, _ = w18
    model = build(settings)
    state, report = convert_state_dict(model, paddle_state, NAME)
    model.load_state_dict(state, strict=True)
    return model.eval(), report


def test_conversion_is_complete(converted, paddle_state):
    _, report = converted
    assert report.missing == [] and report.skipped == [] and report.unused == [], report.lines()
    assert report.complete and len(report.loaded) == report.total == len(paddle_state) == 1583


def test_eval_logits_match_paddle(converted, expected):
    """float32 against the original's float32. At real size both carry float32 rounding of the order
    of 1e-4 (Paddle's own float32 logits are 4e-4 from its float64 ones; the eval logits reach 37):
    ppdist's must be within 1e-4 of the logits' range from the exact (float64) result and from
    Paddle's float32 ones (as tests/convert/test_seg_equivalence.py at real size: a bound of float32
    rounding, not of one CPU's reduction order). The soft regions (O(1)) are within 1e-4 absolute."""
    model, _ = converted
    captured = {}
    hooks = [  # the head's two outputs before upsampling
        model.head.cls_head.register_forward_hook(lambda m, i, o: captured.update(main=o)),
        model.head.aux_head.register_forward_hook(lambda m, i, o: captured.update(aux=o)),
    ]
    with torch.no_grad():
        outputs = model(torch.from_numpy(expected["image"]))
    for hook in hooks:
        hook.remove()
    assert isinstance(outputs, list) and len(outputs) == 1  # eval: the main logits only
    logits = outputs[0].numpy()
    diffs = {
        "logits": max_diff(logits, expected["eval_logits"]),
        "head_logits": max_diff(captured["main"], expected["eval_head_logits"]),
        "head_soft_regions": max_diff(captured["aux"], expected["eval_head_soft_regions"]),
    }
    own_error = max_diff(logits, expected["eval_logits_fp64"])
    paddle_error = max_diff(expected["eval_logits"], expected["eval_logits_fp64"])
    scale = float(np.abs(expected["eval_logits"]).max())
    print(
        f"{NAME} eval: max abs diffs " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()) + f" (|logits| "
        f"up to {scale:.1f}); from the float64 result: ppdist {own_error:.2e}, Paddle {paddle_error:.2e}"
    )
    assert diffs["head_soft_regions"] <= 1e-4
    assert max(diffs["logits"], diffs["head_logits"], own_error) <= 1e-4 * max(1.0, scale)
    assert 1.0 < scale < 100.0 and logits.std() > 1.0  # not degenerate


def test_double_precision_matches_paddle(converted, expected):
    """Both sides in float64, eval and train mode (the head's outputs; BatchNorm on the batch's
    statistics in train mode): no float32 rounding, so the comparison is far tighter. What is left
    (~1e-6 of the logits' range) is Paddle's bilinear kernel, which computes its source coordinates in float32
    even on float64 tensors, and the float32 storage of the references."""
    model = copy.deepcopy(converted[0]).double()
    image = torch.from_numpy(expected["image"]).double()
    with torch.no_grad():
        logits = model(image)[0].float()
        model.train()
        model.head.spatial_ocr.conv1x1[1].p = 0.0  # as the fixture
        captured = {}
        model.head.cls_head.register_forward_hook(lambda m, i, o: captured.update(main=o.float()))
        model.head.aux_head.register_forward_hook(lambda m, i, o: captured.update(aux=o.float()))
        model(image)
    diffs = {
        "eval_logits": max_diff(logits, expected["eval_logits_fp64"]),
        "train_head_logits": max_diff(captured["main"], expected["train_head_logits_fp64"]),
        "train_head_soft_regions": max_diff(captured["aux"], expected["train_head_soft_regions_fp64"]),
    }
    print(f"{NAME} (float64): max abs diffs " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    for key, reference in (
        ("eval_logits", "eval_logits_fp64"),
        ("train_head_logits", "train_head_logits_fp64"),
    ):
        assert diffs[key] <= 1e-5 * max(1.0, float(np.abs(expected[reference]).max())), key
    assert diffs["train_head_soft_regions"] <= 1e-5


def test_train_outputs_match_paddle(converted, expected):
    """Train mode in float32: [main, soft regions], both at the input size, against Paddle's float32.
    BatchNorm on one small image's statistics (the 1/32 branch is 2x2) amplifies float32 rounding on
    both sides; the float64 test above is the exact check of the same path."""
    model = copy.deepcopy(converted[0]).train()
    dropout = model.head.spatial_ocr.conv1x1[1]
    assert isinstance(dropout, torch.nn.Dropout2d) and dropout.p == 0.1
    dropout.p = 0.0  # as the fixture: a random mask cannot be reproduced across frameworks
    with torch.no_grad():
        main, soft_regions = model(torch.from_numpy(expected["image"]))
    diffs = {
        "train_logits": max_diff(main, expected["train_logits"]),
        "train_soft_regions": max_diff(soft_regions, expected["train_soft_regions"]),
    }
    print(f"{NAME} train: max abs diffs " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert max(diffs.values()) <= 1e-3 * max(1.0, float(np.abs(expected["train_logits"]).max())), diffs
    assert np.abs(expected["train_soft_regions"]).max() > 1.0


def test_names_map_to_paddleseg(converted):
    model, _ = converted
    renames = stage_renames(model)
    table = {
        "backbone.conv_layer1_1.conv.weight": "backbone.conv_layer1_1._conv.weight",
        "backbone.la1.bb_layer2_1.conv_down.bn.running_var": "backbone.la1.bb_layer2_1.conv_down._batch_norm._variance",
        "backbone.tr2.transition_tr2_layer_3.conv.weight": "backbone.tr2.transition_tr2_layer_3._conv.weight",
        "backbone.st3.stage_st3_4.branches_func.bb_st3_4_branch_layer_3_2.conv2.bn.weight": (
            "backbone.st3.stage_st3_4.branches_func.bb_st3_4_branch_layer_3_2.conv2._batch_norm.weight"
        ),
        "backbone.st4.stage_st4_3.fuse_func.residual_st4_3_layer_4_1_2.bn.running_mean": (
            "backbone.st4.stage_st4_3.fuse_func.residual_st4_3_layer_4_1_2._batch_norm._mean"
        ),
        "backbone.st4.stage_st4_1.fuse_func.residual_st4_1_layer_1_4.conv.weight": (
            "backbone.st4.stage_st4_1.fuse_func.residual_st4_1_layer_1_4._conv.weight"
        ),
        "head.conv3x3_ocr.conv.bias": "head.conv3x3_ocr._conv.bias",
        "head.spatial_ocr.attention_block.f_pixel.1.bn.running_var": (
            "head.spatial_ocr.attention_block.f_pixel.1._batch_norm._variance"
        ),
        "head.spatial_ocr.conv1x1.0.conv.weight": "head.spatial_ocr.conv1x1.0._conv.weight",
        "head.cls_head.weight": "head.cls_head.weight",
        "head.aux_head.1.bias": "head.aux_head.1.bias",
    }
    for key, paddle_key in table.items():
        assert paddle_candidates(model, key, renames) == [paddle_key], key


def test_other_class_count_skips_only_the_classifiers(w18):
    """Fine-tuning on another dataset: the main and auxiliary classifiers do not fit and are listed."""
    settings, paddle_state, _ = w18
    model = build(settings, num_classes=2)
    state, report = convert_state_dict(model, paddle_state, NAME)
    skipped = sorted(
        ["head.aux_head.1.bias", "head.aux_head.1.weight", "head.cls_head.bias", "head.cls_head.weight"]
    )
    assert report.missing == [] and report.unused == []
    assert sorted(entry.split(":")[0] for entry in report.skipped) == skipped
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert sorted(missing) == skipped and unexpected == []


def test_imagenet_backbone_file(converted, paddle_state, expected):
    """PaddleSeg's ImageNet HRNet files (``hrnet_w18_ssld``): the backbone's names without
    ``backbone.``, possibly with a classifier the backbone does not have."""
    model, _ = converted
    backbone_only = {k[len("backbone.") :]: v for k, v in paddle_state.items() if k.startswith("backbone.")}
    classifier = {"fc.weight": np.zeros((2048, 1000), "float32"), "fc.bias": np.zeros(1000, "float32")}
    state, report = convert_state_dict(model, {**backbone_only, **classifier}, "imagenet", stage="backbone")
    assert report.missing == [] and report.skipped == [], report.lines()
    assert sorted(report.unused) == sorted(classifier)
    current = model.backbone.state_dict()
    assert set(state) == set(current) and len(report.loaded) == len(backbone_only)
    assert all(torch.equal(value, current[key]) for key, value in state.items())


def test_optional_settings_match_paddle():
    """PaddleSeg's optional settings (SE blocks, ``padding_same: false``, ``align_corners: true`` in
    the backbone and the head, two ``backbone_indices``) on a small OCRNet: eval and train outputs,
    float32 and float64."""
    settings, paddle_state, expected = load_fixture(SMALL)
    model = build(settings)
    assert model.backbone.la1.bb_layer2_1.se is not None and model.backbone.align_corners
    state, report = convert_state_dict(model, paddle_state, SMALL)
    assert report.complete and report.unused == [] and len(report.loaded) == len(paddle_state)
    model.load_state_dict(state, strict=True)
    image = torch.from_numpy(expected["image"])
    double = copy.deepcopy(model).double().eval()
    diffs = {}
    with torch.no_grad():
        diffs["eval_logits"] = max_diff(model.eval()(image)[0], expected["eval_logits"])
        diffs["eval_logits_fp64"] = max_diff(double(image.double())[0].float(), expected["eval_logits_fp64"])
        captured = {}
        double.head.cls_head.register_forward_hook(lambda m, i, o: captured.update(main=o.float()))
        double.head.aux_head.register_forward_hook(lambda m, i, o: captured.update(aux=o.float()))
        for net in (model, double):  # train mode, dropout at 0 as the fixture
            net.train().head.spatial_ocr.conv1x1[1].p = 0.0
        main, soft_regions = model(image)
        double(image.double())
    diffs["train_logits"] = max_diff(main, expected["train_logits"])
    diffs["train_soft_regions"] = max_diff(soft_regions, expected["train_soft_regions"])
    diffs["train_head_logits_fp64"] = max_diff(captured["main"], expected["train_head_logits_fp64"])
    diffs["train_head_soft_regions_fp64"] = max_diff(
        captured["aux"], expected["train_head_soft_regions_fp64"]
    )
    print(f"{SMALL}: max abs diffs " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert max(v for k, v in diffs.items() if k.endswith("fp64")) <= 1e-5, diffs
    assert diffs["eval_logits"] <= 1e-4, diffs
    # train mode: BatchNorm on one small image's statistics amplifies float32 rounding (the float64
    # outputs above agree to 1e-6); within 1e-4 relative to the logits' range
    scale = max(1.0, float(np.abs(expected["train_logits"]).max()))
    assert max(diffs["train_logits"], diffs["train_soft_regions"]) <= 1e-4 * scale, diffs
    assert np.abs(expected["eval_logits"]).max() > 1.0 and np.abs(expected["train_soft_regions"]).max() > 1.0
