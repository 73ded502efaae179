"""PP-OCRv3's distillation training step is PaddleOCR's: every CombinedLoss term, the heads' outputs,
the gradients of the Teacher and the Student, BatchNorm statistics, the recipe's Adam + L2 (with the
per-parameter factors) and its Piecewise warm-up LR, against tests/fixtures/paddle_step/rec_ppocrv3.npz
(written by PaddleOCR 2.7's own build_model / build_loss / build_optimizer, MultiLabelEncode and
RecResizeImg on paddlepaddle 2.6.2; make_rec_ppocrv3.py).

The config is the fixture's recipe (configs/rec/PP-OCRv3/ch_PP-OCRv3_rec_distillation.yml's
Architecture, Loss and Optimizer, checked equal here, with the fixture's 40-character dictionary and
the dropouts off); the weights are the fixture's seeded Paddle state dict (27,182,028 trainable
parameters, Paddle's count). The fixture was made in float64 and ppdist runs in float64 here too (a
forward and backward take ~4 s): float32 rounding moves a few backbone BatchNorm gradient norms by
up to 1.5e-3 on the second batch, which would hide errors of that size. Measured (torch 2.14 CPU):
head outputs 2.7e-8 relative (the fixture stores them in float32); every loss term from ppdist's
forward and on Paddle's head outputs ≤ 1.0e-7 relative (ppdist computes losses in float32); sampled
gradients ≤ 1.8e-5 relative, median 4.4e-8 (4 biases exactly 0 in both); BatchNorm statistics
1.2e-7 (stored in float32); Adam + L2 replay 1.1e-12 of the update (without the backbone
BatchNorms' L2Decay(0): 0.86; with the CTC heads' fc_decay 1e-5 replaced by 3e-5: 4.4e-5); the LR
at all 1600 steps of 800 epochs x 2 equal. In float32: outputs 9.5e-6, loss terms 4.0e-7, first
batch's gradients ≤ 3.4e-5. No Paddle is needed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from typing import Any, Dict

import numpy as np
import pytest
import torch
import yaml
from paddle_step_testing import gradient_errors, load_arrays, relative, replay, sample_positions, to_torch

from ppdist.components import build_loss, build_model
from ppdist.config import load_config
from ppdist.engine.setup import build_optimizer
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "configs", "rec", "PP-OCRv3", "ch_PP-OCRv3_rec_distillation.yml")
HERE = os.path.join(ROOT, "tests", "fixtures", "paddle_step")
DROPOUTS = {"Neck": ("drop_rate", "attn_drop_rate"), "SARHead": ("enc_drop_rnn", "pred_dropout")}
MODELS = ("Teacher", "Student")
# gradients exactly zero in both: the constant they add is removed by the next softmax or BatchNorm
ZERO_GRADIENTS = ("head.sar_head.decoder.conv1x1_2.bias", "head.ctc_encoder.encoder.norm.bias")


def fixture_script() -> Any:
    """make_rec_ppocrv3.py as a module (its recipe, weight recipes and .npz layout; Paddle only when run)."""
    spec = importlib.util.spec_from_file_location(
        "make_rec_ppocrv3", os.path.join(HERE, "make_rec_ppocrv3.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = fixture_script()


@pytest.fixture(scope="module")
def fixture() -> Dict[str, np.ndarray]:
    return SCRIPT.unpack(load_arrays(SCRIPT.FIXTURE))


@pytest.fixture(scope="module")
def manifest() -> Dict[str, Any]:
    with open(SCRIPT.MANIFEST) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def paddle_state(manifest) -> Dict[str, np.ndarray]:
    return SCRIPT.synthetic_state(manifest["tensors"], manifest["seed"])


def recipe() -> Dict[str, Any]:
    with open(RECIPE, encoding="utf-8") as f:
        return yaml.safe_load(f)


def fixture_recipe(manifest: Dict[str, Any]) -> Dict[str, Any]:
    """The config PaddleOCR ran, less what its tools/train.py injects (out_channels_list, SAR's
    ignore_index: ppdist derives them from the dictionary too)."""
    config = copy.deepcopy(manifest["recipe"])
    for model in config["Architecture"]["Models"].values():
        del model["Head"]["out_channels_list"]
    del config["Loss"]["loss_config_list"][-1]["DistillationSARLoss"]["ignore_index"]
    return config


@pytest.fixture(scope="module")
def config(manifest, tmp_path_factory):
    """ppdist's config of the fixture's recipe (the shipped recipe's sections and the fixture's
    dictionary, dropouts off) with the recipe's Global.epoch_num, Metric and data sections."""
    raw = fixture_recipe(manifest)
    raw["Global"].update(character_dict_path=SCRIPT.DICTIONARY, epoch_num=SCRIPT.EPOCHS)
    raw["Metric"] = {
        "name": "DistillationMetric",
        "base_metric_name": "RecMetric",
        "main_indicator": "acc",
        "key": "Student",
    }
    transforms = [
        {"DecodeImage": {"img_mode": "BGR", "channel_first": False}},
        {"MultiLabelEncode": None},
        {"RecResizeImg": {"image_shape": [3, 48, 320]}},
        {"KeepKeys": {"keep_keys": ["image", "label_ctc", "label_sar", "length", "valid_ratio"]}},
    ]
    for split in ("Train", "Eval"):
        raw[split] = {
            "dataset": {
                "name": "SimpleDataSet",
                "data_dir": ".",
                "label_file_list": ["labels.txt"],
                "transforms": transforms,
            },
            "loader": {"batch_size_per_card": SCRIPT.BATCH, "shuffle": split == "Train", "num_workers": 0},
        }
    path = tmp_path_factory.mktemp("ppocrv3_step") / "recipe.yml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return load_config(str(path))


def batch_of(fixture: Dict[str, np.ndarray], step: int) -> Dict[str, torch.Tensor]:
    """The fixture's batch ``step`` as ppdist's loader gives it (float32 valid ratio), its image in
    float64 (the model's dtype here)."""
    images = [SCRIPT.normalize(p, w) for p, w in zip(fixture[f"image_{step}"], fixture[f"width_{step}"])]
    batch = {"image": torch.from_numpy(np.stack(images)).double()}
    for key in ("label_ctc", "label_sar", "length"):
        batch[key] = torch.from_numpy(fixture[f"{key}_{step}"])
    batch["valid_ratio"] = torch.from_numpy(fixture[f"valid_ratio_{step}"]).float()
    return batch


@pytest.fixture(scope="module")
def model(config, paddle_state):
    """ppdist's model in float64 with the fixture's Paddle weights and BatchNorm rule."""
    built = build_model(config).double()
    built.load_state_dict(to_torch(built, paddle_state))
    apply_statistics_rule(built, "paddle")
    return built


@pytest.fixture(scope="module")
def positions(model, paddle_state, fixture):
    found = sample_positions(model, paddle_state, fixture)
    assert (
        len(found)
        == len(list(model.parameters()))
        == len([key for key in fixture if key.startswith("grad_index/")])
    )
    return found


@pytest.fixture(scope="module")
def run(config, model, fixture):
    """One training forward and backward of ``model`` on the fixture's first batch (the replay
    works on a copy of the model)."""
    model.train()
    batch = batch_of(fixture, 1)
    preds = model(batch)
    loss_fn = build_loss(config)
    losses = loss_fn(preds, batch)
    losses["loss"].backward()
    return {"model": model, "preds": preds, "losses": losses, "loss_fn": loss_fn}


def paddle_terms(fixture: Dict[str, np.ndarray], step: int) -> Dict[str, float]:
    prefix = f"loss_{step}/"
    return {key[len(prefix) :]: float(value) for key, value in fixture.items() if key.startswith(prefix)}


def test_the_shipped_recipe_is_the_one_paddleocr_ran(manifest):
    """Architecture (but the dropouts), Loss and Optimizer of configs/rec/PP-OCRv3's recipe are the
    fixture's, less what PaddleOCR's tools/train.py injects (out_channels_list, SAR's ignore_index)."""
    ours, theirs = recipe(), fixture_recipe(manifest)
    for name in MODELS:
        model = theirs["Architecture"]["Models"][name]
        for entry in model["Head"]["head_list"]:
            ((head, settings),) = entry.items()
            for key in DROPOUTS["Neck" if head == "CTCHead" else head]:
                del (settings["Neck"] if head == "CTCHead" else settings)[key]
        assert {k: v for k, v in ours["Architecture"]["Models"][name].items() if k != "pretrained"} == model
    assert ours["Loss"] == theirs["Loss"]
    assert ours["Optimizer"] == theirs["Optimizer"]


@pytest.mark.slow
def test_head_outputs_and_every_loss_term_equal_paddles(fixture, run):
    for name in MODELS:
        head = run["preds"][name]["head_out"]
        assert relative(head["ctc"].detach().numpy(), fixture[f"ctc_1/{name}"]) <= 1e-6, name
        assert relative(head["sar"].detach().numpy(), fixture[f"sar_1/{name}"]) <= 1e-6, name
    theirs = paddle_terms(fixture, 1)
    ours = {key: float(value.detach()) for key, value in run["losses"].items()}
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))  # Paddle's term names
    for key, value in theirs.items():
        assert abs(ours[key] - value) <= 1e-6 * abs(value), (key, ours[key], value)


def test_loss_terms_on_paddles_head_outputs(fixture, run):
    """The loss alone: ppdist's CombinedLoss on PaddleOCR's head outputs (the backbone features of
    the L2 term are ppdist's own, checked above)."""
    preds = {}
    for name in MODELS:
        ours = run["preds"][name]
        head = dict(ours["head_out"])
        head["ctc"] = torch.from_numpy(fixture[f"ctc_1/{name}"]).double()
        head["sar"] = torch.from_numpy(fixture[f"sar_1/{name}"]).double()
        preds[name] = dict(ours, head_out=head, backbone_out=ours["backbone_out"].detach())
    ours = {k: float(v) for k, v in run["loss_fn"](preds, batch_of(fixture, 1)).items()}
    for key, value in paddle_terms(fixture, 1).items():
        assert abs(ours[key] - value) <= 1e-6 * abs(value), (key, ours[key], value)


def test_raw_gradients_equal_paddles(fixture, run, positions):
    """Sampled entries and full norms of every gradient of both models. Exactly zero in both (a
    constant the next softmax or training-mode BatchNorm removes): the SAR attention score's bias
    and the svtr neck's last LayerNorm bias."""
    errors, zero = gradient_errors(run["model"], positions, fixture)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-4, (worst, errors[worst])
    expected = [f"{name}.{key}" for name in MODELS for key in ZERO_GRADIENTS]
    assert sorted(positions[key][0] for key in zero) == sorted(expected), zero


def test_batch_norm_statistics_after_the_training_forward_equal_paddles(fixture, run, paddle_state):
    state = dict(paddle_state)
    state.update({key[len("bn_1/") :]: value for key, value in fixture.items() if key.startswith("bn_1/")})
    expected = to_torch(run["model"], state)
    errors = {}
    for key, buffer in run["model"].state_dict().items():
        if key.rpartition(".")[2] in ("running_mean", "running_var"):
            ours, theirs = buffer.double().numpy(), expected[key].double().numpy()
            errors[key] = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    assert len(errors) == len([key for key in fixture if key.startswith("bn_1/")])
    assert max(errors.values()) <= 1e-6, max(errors, key=errors.get)


def test_adam_l2_replay_of_paddles_gradients_equals_paddles_update(
    config, model, positions, fixture, paddle_state
):
    """Two steps: LR 0 (the warm-up's first), then 5e-5; L2 3e-5, CTC heads' fc_decay 1e-5, the
    backbone BatchNorms' L2Decay(0)."""
    replica = copy.deepcopy(model)
    replica.load_state_dict(to_torch(replica, paddle_state))
    optimizer, scheduler = build_optimizer(config, replica, SCRIPT.STEPS_PER_EPOCH)
    assert replay(replica, optimizer, scheduler, positions, fixture) <= 1e-9


def test_piecewise_warmup_schedule_equals_paddleocrs(config, fixture):
    model = torch.nn.Linear(1, 1)
    optimizer, scheduler = build_optimizer(config, model, SCRIPT.STEPS_PER_EPOCH)
    ours = []
    for _ in range(len(fixture["schedule_lr"])):
        ours.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    np.testing.assert_array_equal(np.asarray(ours), fixture["schedule_lr"])
