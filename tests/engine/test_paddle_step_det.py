"""A PP-YOLOE-s training step is PaddleDetection's, in both assigner phases (ATSS before
``static_assigner_epoch``, TAL after): every loss term, gradients, BatchNorm statistics, the
recipe's Momentum + L2, ModelEMA and the LR schedule, against tests/fixtures/paddle_step/det.npz
(written by PaddleDetection v2.7.0's own model, assigners, losses, optimizer builder, LR and EMA
on paddlepaddle 2.6.2; make_det.py).

The fixture's forward ran in float32 (PaddleDetection's loss code makes float32 tensors, so a
float64 forward fails), its optimizer/EMA replay in float64. Measured (torch 2.14 CPU, float32):
every loss term on Paddle's head outputs ≤ 1.2e-7 relative (both phases), from ppdist's own forward
≤ 7.1e-7 (class logits 7.6e-7); sampled gradients ≤ 5.0e-5 relative norm (ATSS: 7, TAL: 1
BatchNorm biases with an exactly zero gradient in both); BatchNorm statistics ≤ 1.1e-6 (torch's
unbiased rule: 8.4e-3); Momentum + L2 replay at LR 0.01 ≤ 6.0e-8 of the update (float64),
ModelEMA ≤ 2.0e-7; the LR equal to the last bit at 11,341 steps of the 549,600
(all of the warmup). No Paddle is needed.
"""

import importlib.util
import os
from typing import Dict

import numpy as np
import pytest
import torch
from paddle_step_testing import (
    batch_norm_errors,
    gradient_errors,
    load_arrays,
    relative,
    replay,
    sample_positions,
    to_torch,
)
from ppdist_testing import paddle_fixture_script

from ppdist.components import build_loss, build_model
from ppdist.config import load_config
from ppdist.engine.ema import ModelEMA
from ppdist.engine.setup import build_optimizer
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "det", "ppyoloe_crn_s_300e_coco.yml")
STEP_DIR = os.path.join(ROOT, "tests", "fixtures", "paddle_step")
FIXTURE = os.path.join(STEP_DIR, "det.npz")
PHASES = {"atss": 0, "tal": 100}
TERMS = ("loss", "loss_cls", "loss_iou", "loss_dfl", "loss_l1")


def make_det():
    """make_det.py as a module: its settings, ground truth and numpy weight recipe."""
    spec = importlib.util.spec_from_file_location(
        "paddle_step_make_det", os.path.join(STEP_DIR, "make_det.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = make_det()


@pytest.fixture(scope="module")
def fixture() -> Dict[str, np.ndarray]:
    return load_arrays(FIXTURE)


def paddle_state() -> Dict[str, np.ndarray]:
    return MAKE.det_state(paddle_fixture_script("det"))


def batch(epoch_id: int) -> Dict[str, torch.Tensor]:
    gt_class, gt_bbox, pad = MAKE.ground_truth()
    return {
        "gt_class": torch.from_numpy(gt_class),
        "gt_bbox": torch.from_numpy(gt_bbox),
        "pad_gt_mask": torch.from_numpy(pad),
        "epoch_id": epoch_id,
    }


def image(fixture) -> torch.Tensor:
    return (torch.from_numpy(fixture["image"]).double() / 255.0).float()


@pytest.fixture(scope="module")
def run(fixture):
    """ppdist's PP-YOLOE-s (float32, Paddle's weights): per phase the losses and gradients of one
    training forward/backward on the fixture's batch; the BatchNorm statistics after the first."""
    config = load_config(CONFIG)
    model = build_model(config)
    state = paddle_state()
    model.load_state_dict(to_torch(model, state))
    positions = sample_positions(model, state, fixture)
    assert (
        len(positions)
        == len(list(model.parameters()))
        == len([k for k in fixture if k.startswith("grad_index/")])
    )
    loss_fn = build_loss(config)
    apply_statistics_rule(model, "paddle")
    model.train()
    result = {"config": config, "positions": positions, "loss_fn": loss_fn}
    for phase, epoch_id in PHASES.items():
        model.load_state_dict(to_torch(model, state))
        model.zero_grad(set_to_none=True)
        preds = model({"image": image(fixture)})
        losses = loss_fn(preds, batch(epoch_id))
        losses["loss"].backward()
        result[phase] = {
            "losses": {k: v.item() for k, v in losses.items()},
            "model": model,
            "preds": {k: v.detach() if torch.is_tensor(v) else v for k, v in preds.items()},
        }
        if phase == "atss":
            result["bn"] = {k: v.clone() for k, v in model.state_dict().items() if "running_" in k}
            result["grads_atss"] = {k: p.grad.clone() for k, p in model.named_parameters()}
    result["grads_tal"] = {k: p.grad.clone() for k, p in model.named_parameters()}
    return result


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_every_loss_term_on_paddles_head_outputs_equals_paddledetection(fixture, run, phase):
    preds = dict(run[phase]["preds"])
    preds["cls_logits"] = torch.from_numpy(fixture["cls_logits"])
    preds["reg_distri"] = torch.from_numpy(fixture["reg_distri"])
    ours = run["loss_fn"](preds, batch(PHASES[phase]))
    for term in TERMS:
        theirs = float(fixture[f"loss_{phase}/{term}"])
        assert abs(ours[term].item() - theirs) <= 1e-4 * abs(theirs), term


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_loss_terms_from_ppdists_forward_equal_paddledetection(fixture, run, phase):
    assert relative(run["atss"]["preds"]["cls_logits"].double().numpy(), fixture["cls_logits"]) <= 1e-4
    for term in TERMS:
        theirs = float(fixture[f"loss_{phase}/{term}"])
        assert abs(run[phase]["losses"][term] - theirs) <= 1e-4 * abs(theirs), term


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_raw_gradients_equal_paddledetection(fixture, run, phase):
    renamed = {k.replace(f"_{phase}/", "_1/"): v for k, v in fixture.items() if f"_{phase}/" in k}
    model = run[phase]["model"]
    for key, p in model.named_parameters():
        p.grad = run[f"grads_{phase}"][key]
    errors, zero = gradient_errors(model, run["positions"], dict(fixture, **renamed))
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-3, (worst, errors[worst])
    assert len(zero) < len(errors) // 10, zero


def test_batch_norm_statistics_after_the_training_forward_equal_paddledetection(fixture, run):
    state = paddle_state()
    state.update({key[len("bn_1/") :]: value for key, value in fixture.items() if key.startswith("bn_1/")})
    model = build_model(run["config"])
    model.load_state_dict(dict(model.state_dict(), **run["bn"]))
    errors = batch_norm_errors(model, to_torch(model, state))
    assert len(errors) == len([key for key in fixture if key.startswith("bn_1/")])
    assert max(errors.values()) <= 1e-4, max(errors, key=errors.get)


def test_momentum_and_ema_replay_equal_paddledetection(fixture, run):
    """Paddle's ATSS then TAL gradients through ppdist's Momentum + L2 at the recipe's LR from the
    end of the warmup, each step followed by the EMA update (float64, as the fixture's replay)."""
    model = build_model(run["config"]).double()
    model.load_state_dict(to_torch(model, paddle_state()))
    optimizer, scheduler = build_optimizer(run["config"], model, MAKE.STEPS_PER_EPOCH)
    scheduler.load_state_dict({"last_step": MAKE.REPLAY_FROM})
    glob = run["config"]["Global"]
    ema = ModelEMA(model, decay=glob["ema_decay"], decay_type=glob["ema_decay_type"])
    ema_errors = []

    def after_step(step):
        ema.update(model)
        for key, p in ema.module.named_parameters():
            owner, where = run["positions"][key]
            ours = p.detach().double().numpy().reshape(-1)[where]
            theirs = fixture[f"ema_{step}/{owner}"]
            ema_errors.append(float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-12)))

    renamed = {
        f"grad_{s}/{k.split('/', 1)[1]}": v
        for s, phase in ((1, "atss"), (2, "tal"))
        for k, v in fixture.items()
        if k.startswith(f"grad_{phase}/")
    }
    assert (
        replay(model, optimizer, scheduler, run["positions"], dict(fixture, **renamed), after_step=after_step)
        <= 1e-5
    )
    assert max(ema_errors) <= 1e-5


def test_lr_schedule_of_the_recipe_equals_paddledetection(fixture, run):
    _, scheduler = build_optimizer(run["config"], torch.nn.Linear(1, 1), MAKE.STEPS_PER_EPOCH)
    ours = np.array([scheduler.schedule.lr_at(int(step)) for step in MAKE.lr_steps()])
    np.testing.assert_array_equal(ours, fixture["lr_values"])
