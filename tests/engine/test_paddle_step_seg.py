"""A PP-LiteSeg-T training step is PaddleSeg's: the three heads' OHEM losses, gradients,
BatchNorm statistics, the recipe's Momentum with weight decay and its LR schedule, against
tests/fixtures/paddle_step/seg.npz (written by PaddleSeg v2.9.1's own model, loss, optimizer and
schedule on paddlepaddle 2.6.2; make_seg.py).

The fixture was made in float64, free of Paddle's float32 rounding; ppdist runs in float32 here.
Measured (torch 2.14 CPU): each head's OHEM loss on given logits (three OHEM regimes) 1.1e-7
relative, from ppdist's own forward 9.6e-8; sampled gradients ≤ 8.2e-5 relative norm (4
parameters have an exactly zero gradient in both); BatchNorm statistics ≤ 1.3e-6 (torch's
unbiased rule: 6.4e-2, at the SPPM's 1x1 bin where N is the batch, 2); Momentum + weight-decay
replay (float64) ≤ 6.1e-8 of the update (Paddle keeps the LR in float32); LR equal at 3,729 of the 160k steps (all of the warmup and the 1000 after). No Paddle is needed.
"""

import json
import os
from typing import Dict

import numpy as np
import pytest
import torch
from paddle_step_testing import (
    batch_norm_errors,
    gradient_errors,
    load_arrays,
    replay,
    sample_positions,
    to_torch,
)
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir, paddle_fixture_script

from ppdist.components import build_loss, build_model
from ppdist.config import load_config
from ppdist.engine.setup import build_optimizer
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "seg", "pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "paddle_step", "seg.npz")
NAME = "pp_liteseg_stdc1_cityscapes"
MIN_KEPT = 12000  # make_seg.py's (the recipe's 130000 would keep every pixel of its small batch)
TEACHER_SCALES = (1.0, 0.5, 3.0)


@pytest.fixture(scope="module")
def fixture() -> Dict[str, np.ndarray]:
    return load_arrays(FIXTURE)


def paddle_state() -> Dict[str, np.ndarray]:
    """The real-size PP-LiteSeg-T's Paddle state dict (tests/fixtures/paddle_seg: seeded + calibrated)."""
    with open(os.path.join(paddle_fixture_dir("seg"), f"{NAME}.json")) as f:
        manifest = json.load(f)
    state = paddle_fixture_script("seg").synthetic_state(manifest["tensors"], manifest["seed"])
    arrays = paddle_fixture_arrays("seg", NAME)
    state.update({key[len("state/") :]: value for key, value in arrays.items() if key.startswith("state/")})
    return state


def recipe():
    config = load_config(CONFIG)
    for loss in config["Loss"]["types"]:
        loss["min_kept"] = MIN_KEPT
    return config


def normalize(pixels: np.ndarray) -> torch.Tensor:
    """make_seg.py's input from its uint8 pixels (Normalize, mean and std 0.5), in float32."""
    return ((torch.from_numpy(pixels).double() / 255.0 - 0.5) / 0.5).float()


def lr_steps() -> np.ndarray:
    """make_seg.py's LR sample: the warmup and the 1000 steps after it, every 97th, the last 100."""
    return np.concatenate(
        [np.arange(0, 2001), np.arange(2001, 160000 - 100, 97), np.arange(160000 - 100, 160000)]
    )


@pytest.fixture(scope="module")
def run(fixture):
    """ppdist's PP-LiteSeg-T (float32, Paddle's weights) after one training forward and backward
    on the fixture's first batch."""
    config = recipe()
    model = build_model(config)
    state = paddle_state()
    model.load_state_dict(to_torch(model, state))
    positions = sample_positions(model, state, fixture)
    assert (
        len(positions)
        == len(list(model.parameters()))
        == len([k for k in fixture if k.startswith("grad_index/")])
    )
    apply_statistics_rule(model, "paddle")
    model.train()
    loss_fn = build_loss(config)
    losses = loss_fn(model({"image": normalize(fixture["image_1"])}), {"label": label(fixture, 1)})
    losses["loss"].backward()
    return {"config": config, "model": model, "losses": losses, "loss_fn": loss_fn, "positions": positions}


def label(fixture: Dict[str, np.ndarray], step: int) -> torch.Tensor:
    return torch.from_numpy(fixture[f"label_{step}"].astype(np.int64))


def test_ohem_losses_on_given_logits_equal_paddleseg(fixture, run):
    logits = torch.from_numpy(fixture["teacher_logits"])
    preds = [logits * scale for scale in TEACHER_SCALES]
    ours = run["loss_fn"](preds, {"label": torch.from_numpy(fixture["teacher_label"].astype(np.int64))})
    for head in range(3):
        theirs = float(fixture[f"teacher_loss_{head}"])
        assert abs(ours[f"loss_{head}"].item() - theirs) <= 1e-4 * theirs, head


def test_loss_of_each_head_from_ppdists_forward_equals_paddleseg(fixture, run):
    for head in range(3):
        theirs = float(fixture[f"loss_1_{head}"])
        assert abs(run["losses"][f"loss_{head}"].item() - theirs) <= 1e-4 * theirs, head
    assert abs(run["losses"]["loss"].item() - float(fixture["loss_1"])) <= 1e-4 * float(fixture["loss_1"])


def test_raw_gradients_equal_paddleseg(fixture, run):
    errors, zero = gradient_errors(run["model"], run["positions"], fixture)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-3, (worst, errors[worst])
    assert len(zero) < len(errors) // 10, zero


def test_batch_norm_statistics_after_the_training_forward_equal_paddleseg(fixture, run):
    state = paddle_state()
    state.update({key[len("bn_1/") :]: value for key, value in fixture.items() if key.startswith("bn_1/")})
    errors = batch_norm_errors(run["model"], to_torch(run["model"], state))
    assert len(errors) == len([key for key in fixture if key.startswith("bn_1/")])
    assert max(errors.values()) <= 1e-4, max(errors, key=errors.get)


def test_momentum_replay_of_paddles_gradients_equals_paddles_update(fixture, run):
    model = build_model(run["config"]).double()
    model.load_state_dict(to_torch(model, paddle_state()))
    optimizer, scheduler = build_optimizer(run["config"], model, 1000)
    assert replay(model, optimizer, scheduler, run["positions"], fixture) <= 1e-5


def test_lr_schedule_of_the_recipe_equals_paddleseg(fixture, run):
    _, scheduler = build_optimizer(run["config"], torch.nn.Linear(1, 1), 1000)
    ours = np.array([scheduler.schedule.lr_at(int(step)) for step in lr_steps()])
    np.testing.assert_array_equal(ours, fixture["lr_values"])
