"""PaddleOCR CRNN weights -> ppdist: complete conversion and the original's outputs.

The fixtures (tests/fixtures/paddle_rec, written by its make_fixtures.py with paddlepaddle 3.3.1
and PaddleOCR 2.7's own modules) hold the eval-mode CTC probabilities of the original model:

* ``crnn_small``: a scaled-down recogniser (MobileNetV3 small 0.35, strides [1, 2, 2, 2],
  hidden 24, 37 classes) saved by ``paddle.save``;
* ``rec_mv3_none_bilstm_ctc``: the real-size model of configs/rec/rec_mv3_none_bilstm_ctc.yml,
  whose weights are re-created from the fixture's seed and manifest (Paddle names and shapes).

Measured max abs differences of the probabilities (torch 2.14 CPU): 1.5e-6 (crnn_small) and
1.4e-5 (real size). No Paddle is needed.
"""

import json
import os

import numpy as np
import pytest
import torch
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir, paddle_fixture_script

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.convert.weights import convert_state_dict, load_paddle_weights
from ppdist.convert.weights.naming import paddle_candidates, stage_renames
from ppdist.convert.weights.pdparams import load_pdparams
from ppdist.modeling.layers import SEModule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = paddle_fixture_dir("rec")
CONFIG = os.path.join(ROOT, "configs", "rec", "rec_mv3_none_bilstm_ctc.yml")
TOLERANCE = 1e-4

FX = paddle_fixture_script("rec")


def reference(name):
    return paddle_fixture_arrays("rec", name)


def small_model(overrides=()):
    """The ppdist model of the crnn_small fixture, from the rec config with its settings."""
    settings = FX.FIXTURES["crnn_small"]
    backbone, neck = settings["Backbone"], settings["Neck"]
    return build_model(
        load_config(
            CONFIG,
            [
                f"Architecture.Backbone.model_name={backbone['model_name']}",
                f"Architecture.Backbone.scale={backbone['scale']}",
                f"Architecture.Backbone.small_stride={backbone['small_stride']}",
                f"Architecture.Neck.hidden_size={neck['hidden_size']}",
                *overrides,
            ],
        )
    )


def real_model(overrides=()):
    return build_model(load_config(CONFIG, list(overrides)))


def real_paddle_state():
    """The real-size fixture's Paddle state dict: seeded weights + the stored BatchNorm statistics."""
    with open(os.path.join(FIXTURES, "rec_mv3_none_bilstm_ctc.json")) as f:
        manifest = json.load(f)
    state = FX.synthetic_state(manifest["tensors"], manifest["seed"])
    statistics = {
        key[len("state/") :]: value
        for key, value in reference("rec_mv3_none_bilstm_ctc").items()
        if key.startswith("state/")
    }
    assert statistics and set(statistics) <= set(state)
    state.update(statistics)
    return state


def run(model, state, image):
    model.load_state_dict(state, strict=True)
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(image)).numpy()


def assert_complete(report, paddle_state):
    assert report.missing == [] and report.skipped == [], report.lines()
    assert report.unused == [], report.lines()
    assert report.complete and len(report.loaded) == report.total
    assert len(paddle_state) >= report.total


def max_diff(probs, expected):
    assert probs.shape == expected.shape
    return float(np.abs(probs - expected).max())


def test_small_fixture_from_pdparams_matches_paddle():
    model = small_model()
    state, report = load_paddle_weights(model, os.path.join(FIXTURES, "crnn_small.pdparams"))
    assert_complete(report, load_pdparams(os.path.join(FIXTURES, "crnn_small.pdparams")))
    expected = reference("crnn_small")
    probs = run(model, state, expected["image"])
    diff = max_diff(probs, expected["probs"])
    print(f"crnn_small: max abs diff of the CTC probabilities {diff:.2e}")
    assert diff <= TOLERANCE
    assert np.allclose(probs.sum(axis=2), 1.0, atol=1e-5)
    # the fixture is not degenerate: peaked, varied predictions
    assert probs.max(axis=2).mean() > 0.2 and len(np.unique(probs.argmax(axis=2))) > 3


def test_real_size_model_matches_paddle():
    model = real_model()
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 1_451_787
    paddle_state = real_paddle_state()
    state, report = convert_state_dict(model, paddle_state, "rec_mv3_none_bilstm_ctc")
    assert_complete(report, paddle_state)
    expected = reference("rec_mv3_none_bilstm_ctc")
    model.load_state_dict(state, strict=True)
    model.eval()
    with torch.no_grad():
        image = torch.from_numpy(expected["image"])
        backbone_out = model.backbone(image)
        neck_out = model.neck(backbone_out)
        probs = model.head(neck_out).numpy()
    diffs = {
        "backbone_out": max_diff(backbone_out.numpy(), expected["backbone_out"]),
        "neck_out": max_diff(neck_out.numpy(), expected["neck_out"]),
        "probs": max_diff(probs, expected["probs"]),
    }
    print("rec_mv3_none_bilstm_ctc: max abs diffs " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert diffs["probs"] <= TOLERANCE
    assert diffs["neck_out"] <= TOLERANCE
    assert diffs["backbone_out"] <= 1e-4 * float(np.abs(expected["backbone_out"]).max())  # values up to ~30


@pytest.mark.parametrize("dropped", ["per-cell", "flat"])
def test_one_lstm_name_form_is_enough(dropped):
    """Paddle 3 writes an LSTM under both names; older files (PaddleOCR's 2.0 release) may hold one."""
    paddle_state = load_pdparams(os.path.join(FIXTURES, "crnn_small.pdparams"))
    per_cell = [k for k in paddle_state if ".cell_fw." in k or ".cell_bw." in k]
    flat = [k for k in paddle_state if "lstm.weight_" in k or "lstm.bias_" in k]
    assert len(per_cell) == len(flat) == 16
    for key in per_cell if dropped == "per-cell" else flat:
        del paddle_state[key]
    model = small_model()
    state, report = convert_state_dict(model, paddle_state, f"crnn_small without {dropped} LSTM names")
    assert_complete(report, paddle_state)
    expected = reference("crnn_small")
    assert max_diff(run(model, state, expected["image"]), expected["probs"]) <= TOLERANCE


def test_lstm_names_map_to_both_paddle_forms():
    model = small_model()
    renames = stage_renames(model)
    assert paddle_candidates(model, "neck.encoder.lstm.weight_ih_l1_reverse", renames) == [
        "neck.encoder.lstm.weight_ih_l1_reverse",
        "neck.encoder.lstm.1.cell_bw.weight_ih",
    ]
    assert paddle_candidates(model, "backbone.conv1.bn.running_var", renames) == [
        "backbone.conv1.bn._variance"
    ]


def test_other_dictionary_skips_only_the_classifier(tmp_path):
    """Fine-tuning with another dictionary: the CTC Linear does not fit and is listed, the rest loads."""
    dictionary = tmp_path / "dict.txt"
    dictionary.write_text("".join(f"{c}\n" for c in "0123456789"))
    model = real_model([f"Global.character_dict_path={dictionary}"])
    assert model.head.fc.out_features == 11  # 10 characters + blank
    state, report = convert_state_dict(model, real_paddle_state(), "rec_mv3_none_bilstm_ctc")
    assert not report.complete and report.missing == [] and report.unused == []
    assert [entry.split(":")[0] for entry in report.skipped] == ["head.fc.weight", "head.fc.bias"]
    assert "file (192, 37)" in report.skipped[0] and "model (11, 192)" in report.skipped[0]
    assert set(state) | {"head.fc.weight", "head.fc.bias"} == set(model.state_dict())
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert sorted(missing) == ["head.fc.bias", "head.fc.weight"] and unexpected == []


def test_fixture_exercises_paddle_hard_sigmoid():
    """PyTorch's hardsigmoid slope (1/6) in the SE gates would be caught by the fixture."""
    model = small_model()
    state, _ = load_paddle_weights(model, os.path.join(FIXTURES, "crnn_small.pdparams"))
    for module in model.modules():
        if isinstance(module, SEModule):
            module.slope = 1.0 / 6.0
    expected = reference("crnn_small")
    assert max_diff(run(model, state, expected["image"]), expected["probs"]) > 1e-2
