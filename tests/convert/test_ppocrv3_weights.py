"""PaddleOCR PP-OCRv3 weight files -> ppdist: a distillation model's file (Teacher./Student. prefixes) and a
student-only file (a ch_PP-OCRv3_rec.yml model's) load completely, as ``Global.pretrained_model``,
``Global.checkpoints`` and a model's ``Models.<name>.pretrained``, and give the original's outputs.

The files are tests/fixtures/paddle_ppocrv3/distill_small.pdparams and student_small.pdparams, written
by ``paddle.save`` in its make_fixtures.py (paddlepaddle 2.6.2, PaddleOCR 2.7's own build_model): a
small DistillationModel with every tensor kind of the real one (MobileNetV1Enhance at scale 0.1, the
svtr neck, CTC head, SAR head with LSTMs) and seeded weights; the npz holds the eval-mode outputs of
both models, computed by a float64 copy of the original; ppdist's model runs in float64 too here.
Measured max abs differences of the probabilities (torch CPU): 3.4e-8 (Student), 3.7e-8 (Teacher);
in float32 on both sides they are 5.3e-5 and 1.9e-5 (float32 rounding through narrow layers).
"""

import copy
import functools
import json
import os

import numpy as np
import pytest
import torch
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir

from ppdist.components import build_model
from ppdist.convert.weights import convert_state_dict, load_pdparams
from ppdist.engine.checkpoint.io import load_file
from ppdist.engine.checkpoint.weights import load_inference_weights, load_initial_weights, load_pretrained
from ppdist.errors import CheckpointError
from ppdist.modeling.backbones.mobilenet_v1_enhance import SEGate
from ppdist.modeling.necks.svtr import Attention

FIXTURES = paddle_fixture_dir("ppocrv3")
DISTILL = os.path.join(FIXTURES, "distill_small.pdparams")
STUDENT = os.path.join(FIXTURES, "student_small.pdparams")
TOLERANCE = 1e-4

with open(os.path.join(FIXTURES, "distill_small.json")) as f:
    SMALL = json.load(f)
EXPECTED = paddle_fixture_arrays("ppocrv3", "distill_small")


@pytest.fixture(scope="module")
def dictionary(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppocrv3") / "digits.txt"
    path.write_text("".join(f"{c}\n" for c in SMALL["dictionary"]))
    return str(path)


def architecture(student_only=False, **student):
    """The fixture's architecture without the injected class counts (build_model injects them)."""
    arch = copy.deepcopy(SMALL["architecture"])
    for model in arch["Models"].values():
        del model["Head"]["out_channels_list"]
    if student_only:
        arch = {k: v for k, v in arch["Models"]["Student"].items() if k != "return_all_feats"}
    else:
        arch["Models"]["Student"].update(student)
    return arch


def build(arch, dictionary):
    config = {
        "Global": {"character_dict_path": dictionary, "use_space_char": True, "pretrained_model": None},
        "Architecture": arch,
        "PostProcess": {"name": "CTCLabelDecode"},
    }
    return build_model(config), config


def eval_outputs(model):
    """Eval-mode outputs in float64, as the fixture's were computed (float32 weights)."""
    model.double().eval()
    with torch.no_grad():
        return model(torch.from_numpy(EXPECTED["image"]).double())


def diff(actual, expected):
    assert tuple(actual.shape) == expected.shape
    return float(np.abs(actual.float().numpy() - expected).max())


def test_distillation_file_converts_completely_and_matches_paddle(dictionary):
    model, _ = build(architecture(), dictionary)
    paddle_state = load_pdparams(DISTILL)
    assert any(k.startswith("Teacher.head.sar_head.") for k in paddle_state)
    state, report = convert_state_dict(model, paddle_state, "distill_small")
    assert report.complete and report.unused == [], report.lines()
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == SMALL["trainable"]
    model.load_state_dict(state, strict=True)
    out = eval_outputs(model)
    diffs = {name: diff(out[name]["head_out"], EXPECTED[name]) for name in ("Student", "Teacher")}
    print("distill_small: max abs diffs " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert all(v <= TOLERANCE for v in diffs.values())
    assert (
        np.abs(EXPECTED["Student"] - EXPECTED["Teacher"]).max() > 0.1
    )  # the two models differ: no swap passes


def test_student_only_file_loads_as_pretrained_and_checkpoint(dictionary):
    model, _ = build(architecture(student_only=True), dictionary)
    load_pretrained(model, STUDENT)  # Global.pretrained_model
    assert diff(eval_outputs(model), EXPECTED["Student"]) <= TOLERANCE
    fresh, _ = build(architecture(student_only=True), dictionary)
    load_inference_weights(
        fresh, load_file(STUDENT), STUDENT
    )  # Global.checkpoints of eval/export: all must fit
    assert diff(eval_outputs(fresh), EXPECTED["Student"]) <= TOLERANCE


def test_distillation_file_loads_as_pretrained_model(dictionary):
    model, _ = build(architecture(), dictionary)
    load_pretrained(model, DISTILL)
    out = eval_outputs(model)
    assert diff(out["Teacher"]["head_out"], EXPECTED["Teacher"]) <= TOLERANCE
    assert diff(out["Student"]["head_out"], EXPECTED["Student"]) <= TOLERANCE


def test_per_model_pretrained_loads_into_that_model_only(dictionary):
    model, config = build(architecture(pretrained=STUDENT), dictionary)
    assert model.pretrained_parts == {"Student": STUDENT}
    assert load_initial_weights(model, config) is True
    out = eval_outputs(model)
    assert diff(out["Student"]["head_out"], EXPECTED["Student"]) <= TOLERANCE
    assert diff(out["Teacher"]["head_out"], EXPECTED["Teacher"]) > 0.1  # the teacher kept its own weights


def test_per_model_pretrained_takes_its_model_of_a_paddleocr_distillation_file(dictionary):
    """PaddleOCR's whole distillation file as ``Models.Teacher.pretrained``: its Teacher. part (issue
    44); ``#Teacher`` gives the Student the Teacher's weights."""
    arch = architecture(pretrained=DISTILL + "#Teacher")
    arch["Models"]["Teacher"]["pretrained"] = DISTILL
    model, config = build(arch, dictionary)
    assert model.pretrained_parts == {"Teacher": DISTILL, "Student": DISTILL + "#Teacher"}
    load_initial_weights(model, config)
    out = eval_outputs(model)
    assert diff(out["Teacher"]["head_out"], EXPECTED["Teacher"]) <= TOLERANCE
    assert diff(out["Student"]["head_out"], EXPECTED["Teacher"]) <= TOLERANCE


def test_weights_of_another_model_are_refused_in_one_line(dictionary):
    other = os.path.join(paddle_fixture_dir("rec"), "crnn_small.pdparams")  # a CRNN's Paddle file
    model, config = build(architecture(pretrained=other), dictionary)
    with pytest.raises(CheckpointError, match=r"crnn_small.pdparams: none of its 245 tensors fits") as info:
        load_initial_weights(model, config)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("mistake", ["se_slope", "attention_scale", "layer_norm_eps"])
def test_fixture_catches_semantic_mistakes(dictionary, mistake):
    """Each of these moves the Student's probabilities past the tolerance (the right model: 6e-8), so the
    fixture checks the semantics, not only the names: SE gate slope 0.2 (MobileNetV3's) instead of
    Paddle's default 1/6 (0.32), the attention without its head_dim ** -0.5 scale (0.24), the svtr
    blocks' LayerNorm epsilon 1e-6 instead of 1e-5 (1.2e-4)."""
    model, _ = build(architecture(), dictionary)
    state, _ = convert_state_dict(model, load_pdparams(DISTILL), "distill_small")
    model.load_state_dict(state, strict=True)
    for module in model.modules():
        if mistake == "se_slope" and isinstance(module, SEGate):
            module.forward = functools.partial(_gate_with_slope, module, 0.2)
        elif mistake == "attention_scale" and isinstance(module, Attention):
            module.scale = 1.0
        elif mistake == "layer_norm_eps" and isinstance(module, torch.nn.LayerNorm) and module.eps == 1e-5:
            module.eps = 1e-6
    moved = diff(eval_outputs(model)["Student"]["head_out"], EXPECTED["Student"])
    print(f"{mistake}: max abs diff {moved:.2e}")
    assert moved > TOLERANCE


def _gate_with_slope(gate, slope, x):
    return x * torch.clamp(gate.conv2(torch.relu(gate.conv1(gate.avg_pool(x)))) * slope + 0.5, 0.0, 1.0)
