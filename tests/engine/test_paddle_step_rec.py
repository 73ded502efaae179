"""A CRNN training step is PaddleOCR's training step: loss, gradients, BatchNorm statistics,
the recipe's Adam and LR schedules, against tests/fixtures/paddle_step/rec.npz (written by
PaddleOCR 2.7's own model, CTCLoss and optimizer builder on paddlepaddle 2.6.2; make_rec.py).

The model is the real-size rec_mv3_none_bilstm_ctc (seeded weights of tests/fixtures/paddle_rec).
The fixture was made in float64, free of Paddle's float32 rounding; ppdist runs in float32 here
(float64 convolutions on CPU take ~40 s). Measured (torch 2.14 CPU, float32 vs the float64
reference): loss on Paddle's logits 2.8e-8 relative, from ppdist's own forward 3.3e-7 (logits
3.9e-6); sampled gradients ≤ 4.1e-5 relative norm (15 BatchNorm biases have an exactly zero
gradient in both); BatchNorm statistics ≤ 2.8e-7 relative (torch's unbiased rule: 5.3e-4);
Adam replay (float64) ≤ 2.2e-13 of the update; the quick start's Cosine + warmup LR equal at all 3000 steps. No Paddle is
needed.
"""

import json
import os
from typing import Dict

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from paddle_step_testing import (
    batch_norm_errors,
    gradient_errors,
    load_arrays,
    relative,
    replay,
    sample_positions,
    to_torch,
)
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir, paddle_fixture_script
from torch.nn.parallel import DistributedDataParallel

from ppdist.components import build_loss, build_model
from ppdist.config import load_config
from ppdist.engine.setup import build_optimizer
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "rec", "rec_mv3_none_bilstm_ctc.yml")
QUICKSTART = os.path.join(ROOT, "configs", "rec", "quickstart_synth.yml")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "paddle_step", "rec.npz")
STEPS_PER_EPOCH = 1000  # what make_rec.py gave PaddleOCR's builder (the LR is constant)


def normalize(pixels: np.ndarray) -> torch.Tensor:
    """make_rec.py's input from its uint8 pixels (RecResizeImg's scaling), in float32."""
    return ((torch.from_numpy(pixels).double() / 255.0 - 0.5) / 0.5).float()


@pytest.fixture(scope="module")
def fixture() -> Dict[str, np.ndarray]:
    return load_arrays(FIXTURE)


def paddle_state() -> Dict[str, np.ndarray]:
    """The real-size CRNN's Paddle state dict (tests/fixtures/paddle_rec: seeded + calibrated)."""
    with open(os.path.join(paddle_fixture_dir("rec"), "rec_mv3_none_bilstm_ctc.json")) as f:
        manifest = json.load(f)
    state = paddle_fixture_script("rec").synthetic_state(manifest["tensors"], manifest["seed"])
    arrays = paddle_fixture_arrays("rec", "rec_mv3_none_bilstm_ctc")
    state.update({key[len("state/") :]: value for key, value in arrays.items() if key.startswith("state/")})
    return state


@pytest.fixture(scope="module")
def run(fixture):
    """ppdist's model (float64, Paddle's weights) after one training forward and backward on the
    fixture's first batch, with its loss function and the sampled-position map."""
    config = load_config(CONFIG)
    model = build_model(config)
    state = paddle_state()
    model.load_state_dict(to_torch(model, state))
    positions = sample_positions(model, state, fixture)
    assert (
        len(positions)
        == len(list(model.parameters()))
        == len([key for key in fixture if key.startswith("grad_index/")])
    )
    apply_statistics_rule(model, "paddle")
    model.train()
    logits = model(normalize(fixture["image_1"]))
    loss_fn = build_loss(config)
    batch = {"label": torch.from_numpy(fixture["label_1"]), "length": torch.from_numpy(fixture["length_1"])}
    loss = loss_fn(logits, batch)["loss"]
    loss.backward()
    return {
        "config": config,
        "model": model,
        "logits": logits,
        "loss": loss,
        "loss_fn": loss_fn,
        "positions": positions,
    }


def test_loss_on_paddles_logits_and_from_ppdists_forward(fixture, run):
    for step in (1, 2):
        batch = {
            "label": torch.from_numpy(fixture[f"label_{step}"]),
            "length": torch.from_numpy(fixture[f"length_{step}"]),
        }
        logits = torch.from_numpy(fixture[f"logits_{step}"]).float()
        teacher = run["loss_fn"](logits, batch)["loss"].item()
        assert abs(teacher - float(fixture[f"loss_{step}"])) <= 1e-4 * abs(float(fixture[f"loss_{step}"]))
    assert relative(run["logits"].detach().double().numpy(), fixture["logits_1"]) <= 1e-4
    assert abs(run["loss"].item() - float(fixture["loss_1"])) <= 1e-4 * float(fixture["loss_1"])


def test_raw_gradients_equal_paddles(fixture, run):
    """Sampled entries and full norms of every parameter's gradient. The bias of a BatchNorm whose
    output feeds a convolution and a training-mode BatchNorm has no effect (the next BatchNorm
    removes the constant): its gradient is 0 up to rounding in both, checked as such."""
    errors, zero = gradient_errors(run["model"], run["positions"], fixture)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-3, (worst, errors[worst])
    assert len(zero) < len(errors) // 10 and all(key.endswith("bn.bias") for key in zero), zero


def test_batch_norm_statistics_after_the_training_forward_equal_paddles(fixture, run):
    state = paddle_state()
    state.update({key[len("bn_1/") :]: value for key, value in fixture.items() if key.startswith("bn_1/")})
    errors = batch_norm_errors(run["model"], to_torch(run["model"], state))
    assert len(errors) == len([key for key in fixture if key.startswith("bn_1/")]) == 2 * 47
    assert max(errors.values()) <= 1e-4, max(errors, key=errors.get)


def test_adam_replay_of_paddles_gradients_equals_paddles_update(fixture, run):
    model = build_model(run["config"]).double()
    model.load_state_dict(to_torch(model, paddle_state()))
    optimizer, scheduler = build_optimizer(run["config"], model, STEPS_PER_EPOCH)
    assert replay(model, optimizer, scheduler, run["positions"], fixture) <= 1e-5


def test_quickstart_cosine_warmup_schedule_equals_paddleocrs(fixture):
    config = load_config(QUICKSTART, ["Global.epoch_num=12"])
    model = torch.nn.Linear(1, 1)
    optimizer, scheduler = build_optimizer(config, model, 250)
    ours = []
    for _ in range(len(fixture["quickstart_lr"])):
        ours.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    np.testing.assert_array_equal(np.asarray(ours), fixture["quickstart_lr"])


DIST_FIXTURE = os.path.join(ROOT, "tests", "fixtures", "paddle_step", "rec_dist.npz")
WORLD = 2


def ddp_worker(rank: int, store: str, out: str) -> None:
    """One of two gloo processes: the fixture's first batch split as make_rec_dist.py splits it,
    under DDP with ppdist's defaults (rank 0's BatchNorm buffers broadcast, gradients averaged)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        fixture = load_arrays(FIXTURE)
        config = load_config(CONFIG)
        model = build_model(config)
        state = paddle_state()
        model.load_state_dict(to_torch(model, state))
        positions = sample_positions(model, state, fixture)
        apply_statistics_rule(model, "paddle")
        model.train()
        parallel = DistributedDataParallel(model)
        rows = slice(2 * rank, 2 * rank + 2)
        logits = parallel(normalize(fixture["image_1"][rows]))
        batch = {
            "label": torch.from_numpy(fixture["label_1"][rows]),
            "length": torch.from_numpy(fixture["length_1"][rows]),
        }
        loss = build_loss(config)(logits, batch)["loss"]
        loss.backward()
        result = {"loss": loss.item()}
        if rank == 0:
            result["grad"] = {
                owner: p.grad.double().numpy().reshape(-1)[positions[key][1]]
                for key, p in model.named_parameters()
                for owner in [positions[key][0]]
            }
            result["grad_norm"] = {positions[k][0]: p.grad.norm().item() for k, p in model.named_parameters()}
            result["bn"] = {k: v.double().numpy() for k, v in model.state_dict().items() if "running_" in k}
        gathered = [None] * WORLD
        dist.all_gather_object(gathered, result)
        if rank == 0:
            torch.save(gathered, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_process_ddp_step_equals_paddles_data_parallel_step(tmp_path):
    """CTC's per-process batch mean, DDP's gradient average and per-process BatchNorm statistics
    are PaddleOCR's under paddle.DataParallel (fixture: 2 CPU processes, gloo)."""
    expected = load_arrays(DIST_FIXTURE)
    out = tmp_path / "ranks.pt"
    mp.spawn(ddp_worker, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD)
    ranks = torch.load(out, weights_only=False)
    for rank, result in enumerate(ranks):
        theirs = float(expected[f"loss_rank{rank}"])
        assert abs(result["loss"] - theirs) <= 1e-4 * theirs, rank
    total = float(np.sqrt(sum(n * n for n in ranks[0]["grad_norm"].values())))
    worst = 0.0
    for owner, ours in ranks[0]["grad"].items():
        theirs = expected[f"grad/{owner}"]
        if np.linalg.norm(theirs) <= 1e-9 * total:  # a BatchNorm bias with no effect: 0 in both
            assert np.linalg.norm(ours) <= 1e-6 * total, owner
            continue
        worst = max(worst, relative(ours, theirs))
    assert worst <= 1e-3
    state = paddle_state()
    state.update({k[len("bn_rank0/") :]: v for k, v in expected.items() if k.startswith("bn_rank0/")})
    bn_expected = to_torch(build_model(load_config(CONFIG)), state)
    for key, ours in ranks[0]["bn"].items():
        theirs = bn_expected[key].double().numpy()
        assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max(), key
