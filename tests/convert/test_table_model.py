"""SLANet (PPLCNet + CSPPAN + SLAHead) against PaddleOCR's own model: trainable parameter counts of
SLANet.yml and SLANet_ch.yml, and a PaddleOCR-built small SLANet's weight file
(tests/fixtures/paddle_table/slanet_small.pdparams, written by make_model_fixture.py beside it with
paddlepaddle 2.6.2) loaded by ppdist's converter: training outputs (teacher-forced structure scores and
boxes) and eval outputs (the greedy decode's probabilities and boxes, the neck's maps) equal Paddle's.

The fixture's outputs were computed by a float64 copy of the original (float32 weights and
statistics), so ppdist's model runs in float64 here too. Measured max abs differences (torch CPU):
train structure scores 1.8e-6 (|max| 49: the float32 storage of the expected values), train boxes
2.9e-8, eval probabilities 1.2e-7, eval boxes 2.9e-8, neck maps 3.7e-8 of their largest value; the
gradients of a probe loss (head parameters, a backbone and a neck convolution) 5.0e-8 of each
tensor's largest value. With ppdist in float32 they are 4.0e-3, 4.6e-5, 8.0e-5, 3.0e-4, 8.2e-5 and
6.0e-4: the random model's perturbed BatchNorm statistics give maps up to 100 and amplify float32
rounding; no difference of semantics (SE's hard-sigmoid slope is Paddle's float32 0.1666667: the
float64 constant alone moved the float64 gradients by 9e-7).
"""

import copy
import json
import os

import numpy as np
import pytest
import torch
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir

from ppdist.components import build_model
from ppdist.convert.weights import convert_state_dict, load_pdparams
from ppdist.engine.checkpoint.weights import load_pretrained, load_stage_pretrained

FIXTURES = paddle_fixture_dir("table")
TOLERANCE = 1e-4
with open(os.path.join(FIXTURES, "param_counts.json")) as f:
    COUNTS = json.load(f)
with open(os.path.join(FIXTURES, "slanet_small.json")) as f:
    SMALL = json.load(f)
EXPECTED = paddle_fixture_arrays("table", "slanet_small")


def build(arch):
    """A table model built by ppdist's build_model (the head's class count given, as PaddleOCR injects it)."""
    return build_model({"Global": {}, "Architecture": copy.deepcopy(arch)})


def trainable(module):
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


@pytest.mark.parametrize("config", ["SLANet.yml", "SLANet_ch.yml"])
def test_trainable_parameter_count_equals_paddleocr(config):
    expected = COUNTS[config]
    arch = copy.deepcopy(expected["architecture"])  # as written: Backbone.pretrained / use_ssld included
    assert arch["model_type"] == "table" and arch["Backbone"].get("use_ssld") is True
    arch["Head"]["out_channels"] = expected["char_num"]
    model = build(arch)
    assert model.model_type == "table"
    parts = {stage: trainable(getattr(model, stage)) for stage in ("backbone", "neck", "head")}
    assert parts == expected["parts"]
    assert trainable(model) == expected["trainable"]
    # the published *_ppstructure_mobile_v2.0_SLANet_train files hold this model's state dict: every
    # tensor of ppdist's model comes from one of them, with its shape, and none is left over
    paddle_state = {key: np.zeros(shape, np.float32) for key, shape in expected["state_dict"].items()}
    _, report = convert_state_dict(model, paddle_state, config)
    assert report.complete and report.unused == [], report.lines()
    assert report.total == len(paddle_state)


@pytest.fixture(scope="module")
def small_model():
    model = build(SMALL["architecture"])
    state, report = convert_state_dict(
        model, load_pdparams(os.path.join(FIXTURES, "slanet_small.pdparams")), "small"
    )
    assert report.complete and report.unused == [], report.lines()
    model.load_state_dict(state, strict=True)
    assert trainable(model) == SMALL["trainable"]
    return model.double()  # as the fixture's outputs were computed (float32 weights)


def inputs():
    return {
        "image": torch.from_numpy(EXPECTED["image"]).double(),
        "structure": torch.from_numpy(EXPECTED["structure"]),
    }


def diff(actual, expected):
    assert tuple(actual.shape) == expected.shape
    return float(np.abs(actual.detach().numpy() - expected).max())


def test_training_outputs_and_gradients_equal_paddleocr(small_model):
    model = copy.deepcopy(small_model).train()  # a training forward moves the BatchNorm statistics
    out = model(inputs())
    loss = sum((out[key] * torch.from_numpy(EXPECTED[f"probe/{key}"]).double()).sum() for key in out)
    loss.backward()
    grads = {key[len("grad/") :]: value for key, value in EXPECTED.items() if key.startswith("grad/")}
    assert len(grads) == 18  # 16 head tensors, a backbone and a neck convolution
    for name, expected in grads.items():
        grad = model.get_parameter(name).grad
        grad = grad.t() if grad.dim() == 2 else grad  # Paddle's Linear layout [in, out]; the GRU's is torch's
        if name.endswith(("weight_ih", "weight_hh")):
            grad = grad.t()
        scale = max(1.0, float(np.abs(expected).max()))
        assert diff(grad, expected) <= TOLERANCE * scale, name
    assert set(out) == {"structure_probs", "loc_preds"}
    assert (
        diff(out["structure_probs"], EXPECTED["train/structure_probs"]) <= TOLERANCE
    )  # scores, not softmaxed
    assert diff(out["loc_preds"], EXPECTED["train/loc_preds"]) <= TOLERANCE


def test_eval_decode_equals_paddleocr(small_model):
    small_model.eval()
    batch = inputs()
    with torch.no_grad():
        neck = small_model.neck(small_model.backbone(batch["image"]))
        out = small_model(batch)
    for i, feat in enumerate(neck):
        assert diff(feat, EXPECTED[f"eval/neck/{i}"]) <= TOLERANCE
    assert diff(out["structure_probs"], EXPECTED["eval/structure_probs"]) <= TOLERANCE
    assert diff(out["loc_preds"], EXPECTED["eval/loc_preds"]) <= TOLERANCE
    tokens = EXPECTED["eval/structure_probs"].argmax(-1)
    # a decode worth checking: each step's token is fed back, the two images decode differently
    assert len(np.unique(tokens[0])) >= 2 and not np.array_equal(tokens[0], tokens[1])


def test_paddle_file_loads_as_pretrained_model_and_as_backbone_weights(small_model):
    path = os.path.join(FIXTURES, "slanet_small.pdparams")
    whole = build(SMALL["architecture"])
    load_pretrained(whole, path)  # Global.pretrained_model
    for key, value in small_model.state_dict().items():
        assert torch.equal(whole.state_dict()[key].double(), value.double()), key
    backbone_only = build(SMALL["architecture"])
    neck_before = copy.deepcopy(backbone_only.neck.state_dict())
    load_stage_pretrained(backbone_only, "backbone", path)  # Architecture.Backbone.pretrained
    for key, value in small_model.backbone.state_dict().items():
        assert torch.equal(backbone_only.backbone.state_dict()[key].double(), value.double()), key
    for key, value in neck_before.items():
        assert torch.equal(backbone_only.neck.state_dict()[key], value), key
