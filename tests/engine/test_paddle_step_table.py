"""SLANet's training step is PaddleOCR's: the teacher-forced head outputs, SLALoss's three terms, every
gradient, the BatchNorm statistics, the recipe's Adam with ``clip_norm`` 5.0 over three steps and its
Piecewise LR (with and without warm-up), against tests/fixtures/paddle_step/table.npz (written by
PaddleOCR 2.7's own build_model / build_loss / build_optimizer and table transforms on paddlepaddle
2.6.2; make_table.py).

The config is configs/table/SLANet.yml (its Architecture, Loss and Optimizer checked equal to
PaddleOCR's file here) with ``max_text_length`` 10 on 64x64 images: the real widths, 1,875,714
trainable parameters (Paddle's count), seeded Paddle weights. The fixture was made in float64; ppdist
runs in float64 (as the fixture) and float32 (how it trains). ``clip_norm`` is per tensor
(Paddle's ClipGradByNorm): 15, 9 and 2 of the 243 gradients are clipped at steps 1-3 (global norms
50, 26, 19). Measured (torch 2.x CPU, 1 thread), relative errors:

=====================================================  ===========  ===========  =========
check                                                  float32      float64      tolerance
=====================================================  ===========  ===========  =========
teacher-forced structure scores / boxes (norm) (a)     1.4e-5       2.8e-8       1e-4 / 1e-6
loss terms (loss, structure_loss, loc_loss) (b)        1.6e-6       3.0e-8       1e-4 / 1e-6
sampled raw gradients, worst parameter (norm)          2.2e-4       1.1e-7       1e-3 / 1e-5
BatchNorm running statistics after the forward (a)     4.3e-6       1.1e-7       1e-4 / 1e-6
Adam + clip_norm replay, 3 steps (of the update) (c)                2.8e-13      1e-9
LR, 200 steps, with and without warm-up                equal                     equal
=====================================================  ===========  ===========  =========

(a) the fixture stores them in float32. (b) ppdist's loss computes in float32; on Paddle's own
outputs ≤ 3.0e-8. (c) The replay gives each sampled gradient the original's full norm
(paddle_step_testing's ``gradient_with_full_norm``) and clips it with ppdist's own clipper
(``gradient_clipper`` of the config) before Adam: 2.8e-13; without the clip 0.91; with the clip
torch's ``clip_grad_norm_`` makes (max_norm / (norm + 1e-6), ppdist's rule before this test)
1.7e-7. Every gradient is nonzero. No Paddle is needed.
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
from paddle_step_testing import (
    batch_norm_errors,
    gradient_errors,
    load_arrays,
    relative,
    replay,
    sample_positions,
    to_torch,
)

from ppdist.components import build_loss, build_model
from ppdist.config import load_config
from ppdist.engine.setup import build_optimizer, gradient_clipper
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "configs", "table", "SLANet.yml")
HERE = os.path.join(ROOT, "tests", "fixtures", "paddle_step")
LOSS_TERMS = ("loss", "structure_loss", "loc_loss")


def fixture_script() -> Any:
    """make_table.py as a module (its sizes, weight recipes and .npz layout; Paddle only when run)."""
    spec = importlib.util.spec_from_file_location(
        "paddle_step_make_table", os.path.join(HERE, "make_table.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = fixture_script()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fixture() -> Dict[str, np.ndarray]:
    return SCRIPT.unpack(load_arrays(SCRIPT.FIXTURE))


@pytest.fixture(scope="module")
def manifest() -> Dict[str, Any]:
    with open(SCRIPT.MANIFEST, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def paddle_state(manifest) -> Dict[str, np.ndarray]:
    return SCRIPT.synthetic_state(manifest["tensors"], manifest["seed"])


def config(**lr):
    """configs/table/SLANet.yml at the fixture's size; ``lr`` keywords override ``Optimizer.lr``."""
    overrides = [  # Global's max_text_length reaches the head (and wins, as in PaddleOCR's transforms)
        f"Global.max_text_length={SCRIPT.MAX_TEXT_LENGTH}",
        f"Architecture.Head.max_text_length={SCRIPT.MAX_TEXT_LENGTH}",
        "Architecture.Backbone.pretrained=false",
    ]
    return load_config(RECIPE, overrides + [f"Optimizer.lr.{key}={value}" for key, value in lr.items()])


@pytest.fixture(scope="module")
def recipe():
    return config()


@pytest.fixture(scope="module")
def batch(fixture) -> Dict[str, torch.Tensor]:
    return {
        key: torch.from_numpy(fixture[key]) for key in ("image", "structure", "bboxes", "bbox_masks", "shape")
    }


@pytest.fixture(scope="module")
def model64(recipe, paddle_state):
    """ppdist's model in float64 with the fixture's Paddle weights and BatchNorm rule."""
    built = build_model(recipe).double()
    built.load_state_dict(to_torch(built, paddle_state))
    assert apply_statistics_rule(built, "paddle") > 0
    return built


@pytest.fixture(scope="module")
def positions(model64, paddle_state, fixture):
    found = sample_positions(model64, paddle_state, fixture)
    assert (
        len(found)
        == len(list(model64.parameters()))
        == len([key for key in fixture if key.startswith("grad_index/")])
        == 243
    )
    assert sum(p.numel() for p in model64.parameters()) == 1875714
    return found


TOLERANCES = {
    torch.float32: {"outputs": 1e-4, "loss": 1e-4, "gradients": 1e-3, "statistics": 1e-4},
    torch.float64: {"outputs": 1e-6, "loss": 1e-6, "gradients": 1e-5, "statistics": 1e-6},
}


@pytest.fixture(scope="module", params=[torch.float64, torch.float32], ids=["float64", "float32"])
def run(request, recipe, model64, batch):
    """One teacher-forced training forward and backward on the fixture's batch (a copy of the model
    in the parameter's dtype; ``model64`` itself stays untouched for the replay)."""
    dtype = request.param
    model = copy.deepcopy(model64).to(dtype).train()
    inputs = dict(batch, image=batch["image"].to(dtype))
    preds = model(inputs)
    losses = build_loss(recipe)(preds, inputs)
    losses["loss"].backward()
    return {"dtype": dtype, "tolerance": TOLERANCES[dtype], "model": model, "preds": preds, "losses": losses}


def paddle_terms(fixture: Dict[str, np.ndarray], step: int) -> Dict[str, float]:
    return {key: float(fixture[f"loss_{step}/{key}"]) for key in LOSS_TERMS}


def test_the_shipped_recipe_is_the_one_paddleocr_ran(manifest):
    """configs/table/SLANet.yml's Architecture (but the size and the injected class count), Loss
    and Optimizer are PaddleOCR's SLANet.yml's, as make_table.py read them."""
    with open(RECIPE, encoding="utf-8") as f:
        ours = yaml.safe_load(f)
    theirs = copy.deepcopy(manifest["recipe"])
    head = theirs["Architecture"]["Head"]
    assert (head.pop("out_channels"), head["max_text_length"]) == (30, SCRIPT.MAX_TEXT_LENGTH)
    head["max_text_length"] = 500
    assert theirs["Architecture"]["Backbone"].pop("pretrained") is False
    ours["Architecture"]["Backbone"].pop("pretrained")
    assert ours["Architecture"] == theirs["Architecture"]
    assert (
        ours["Loss"]
        == theirs["Loss"]
        == {
            "name": "SLALoss",
            "structure_weight": 1.0,
            "loc_weight": 2.0,
            "loc_loss": "smooth_l1",
        }
    )
    assert ours["Optimizer"] == theirs["Optimizer"]
    assert ours["Optimizer"]["clip_norm"] == 5.0


def test_teacher_forced_outputs_and_loss_terms_equal_paddles(fixture, run):
    tolerance = run["tolerance"]
    for key in ("structure_probs", "loc_preds"):
        error = relative(run["preds"][key].detach().double().numpy(), fixture[f"{key}_1"])
        print(f"{key} ({run['dtype']}): {error:.1e}")
        assert error <= tolerance["outputs"], (key, error)
    ours = {key: float(value.detach()) for key, value in run["losses"].items()}
    assert set(ours) == set(LOSS_TERMS)
    for key, value in paddle_terms(fixture, 1).items():
        error = abs(ours[key] - value) / abs(value)
        print(f"{key} ({run['dtype']}): {error:.1e}")
        assert error <= tolerance["loss"], (key, ours[key], value)


def test_loss_terms_on_paddles_head_outputs(fixture, recipe, batch):
    """The loss alone: ppdist's SLALoss on PaddleOCR's teacher-forced outputs (float32 as stored;
    the loss computes in float32)."""
    preds = {key: torch.from_numpy(fixture[f"{key}_1"]).double() for key in ("structure_probs", "loc_preds")}
    ours = {key: float(value) for key, value in build_loss(recipe)(preds, batch).items()}
    for key, value in paddle_terms(fixture, 1).items():
        print(f"{key} on Paddle's outputs: {abs(ours[key] - value) / abs(value):.1e}")
        assert abs(ours[key] - value) <= 1e-6 * abs(value), (key, ours[key], value)


def test_raw_gradients_equal_paddles(fixture, run, positions):
    """Sampled entries and full norms of all 243 gradients, before the clip."""
    errors, zero = gradient_errors(run["model"], positions, fixture)
    worst = max(errors, key=errors.get)
    print(f"gradients ({run['dtype']}): worst {errors[worst]:.1e} ({worst}); zero {zero}")
    assert errors[worst] <= run["tolerance"]["gradients"], (worst, errors[worst])
    assert zero == []


def test_batch_norm_statistics_after_the_training_forward_equal_paddles(fixture, run, paddle_state):
    expected = dict(paddle_state)
    expected.update({key[len("bn_1/") :]: value for key, value in fixture.items() if key.startswith("bn_1/")})
    errors = batch_norm_errors(run["model"], to_torch(run["model"], expected))
    assert len(errors) == len([key for key in fixture if key.startswith("bn_1/")])
    worst = max(errors, key=errors.get)
    print(f"BatchNorm statistics ({run['dtype']}): worst {errors[worst]:.1e} ({worst})")
    assert errors[worst] <= run["tolerance"]["statistics"], worst


def test_clip_norm_clips_some_gradients_at_every_step(fixture, positions):
    """The fixture exercises the clip: at each step some gradient norms exceed clip_norm 5.0 (the
    first convolution's always; the global norm too: 50, 26, 19) and most do not."""
    for step, count in zip(range(1, SCRIPT.STEPS + 1), (15, 9, 2)):
        norms = {owner: float(fixture[f"grad_norm_{step}/{owner}"]) for owner, _ in positions.values()}
        clipped = sorted(owner for owner, norm in norms.items() if norm > 5.0)
        assert len(clipped) == count and "backbone.conv1.conv.weight" in clipped, (step, clipped)
        assert np.sqrt(sum(norm**2 for norm in norms.values())) > 3 * 5.0


def test_adam_clip_norm_replay_of_paddles_gradients_equals_paddles_update(
    recipe, model64, positions, fixture, paddle_state
):
    """Three steps at the Piecewise schedule's 0.001, each gradient clipped to norm 5 by ppdist's
    clipper, then Adam (beta 0.9 / 0.999, L2 0). Without the clip the replay misses Paddle's
    update by far more than the tolerance."""
    worst = {}
    for clipped in (True, False):
        replica = copy.deepcopy(model64)
        replica.load_state_dict(to_torch(replica, paddle_state))
        optimizer, scheduler = build_optimizer(recipe, replica, SCRIPT.STEPS_PER_EPOCH)
        clip = gradient_clipper(recipe) if clipped else None
        worst[clipped] = replay(
            replica, optimizer, scheduler, positions, fixture, steps=SCRIPT.STEPS, clip=clip
        )
    print(f"Adam + clip_norm replay: {worst[True]:.1e}; without the clip {worst[False]:.1e}")
    assert worst[True] <= 1e-9
    assert worst[False] > 1e-3


@pytest.mark.parametrize("key, warmup", [("schedule_lr", 0), ("schedule_lr_warmup", SCRIPT.WARMUP_EPOCH)])
def test_piecewise_schedule_equals_paddleocrs(fixture, key, warmup):
    optimizer, scheduler = build_optimizer(
        config(warmup_epoch=warmup), torch.nn.Linear(1, 1), SCRIPT.STEPS_PER_EPOCH
    )
    ours = []
    for _ in range(len(fixture[key])):
        ours.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    assert len(ours) == SCRIPT.EPOCHS * SCRIPT.STEPS_PER_EPOCH
    np.testing.assert_array_equal(np.asarray(ours), fixture[key])
