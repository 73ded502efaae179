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

from __future__ import annotations

import gc
import json
import os
from typing import Dict

import numpy as np
import paddle_step_harness as harness
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from paddle_step_testing import load_arrays, relative, sample_positions, to_torch
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir, paddle_fixture_script
from torch.nn.parallel import DistributedDataParallel

from ppdist.components import build_loss, build_model
from ppdist.config import load_config
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule

CONFIG = os.path.join(harness.ROOT, "configs", "rec", "rec_mv3_none_bilstm_ctc.yml")
QUICKSTART = os.path.join(harness.ROOT, "configs", "rec", "quickstart_synth.yml")
FIXTURE = os.path.join(harness.STEP_DIR, "rec.npz")
DIST_FIXTURE = os.path.join(harness.STEP_DIR, "rec_dist.npz")
STEPS_PER_EPOCH = 1000  # what make_rec.py gave PaddleOCR's builder (the LR is constant)
WORLD = 2


def normalize(pixels: np.ndarray) -> torch.Tensor:
    """make_rec.py's input from its uint8 pixels (RecResizeImg's scaling), in float32."""
    return ((torch.from_numpy(pixels).double() / 255.0 - 0.5) / 0.5).float()


def paddle_state() -> harness.Arrays:
    """The real-size CRNN's Paddle state dict (tests/fixtures/paddle_rec: seeded + calibrated)."""
    with open(os.path.join(paddle_fixture_dir("rec"), "rec_mv3_none_bilstm_ctc.json")) as f:
        manifest = json.load(f)
    state = paddle_fixture_script("rec").synthetic_state(manifest["tensors"], manifest["seed"])
    arrays = paddle_fixture_arrays("rec", "rec_mv3_none_bilstm_ctc")
    state.update({key[len("state/") :]: value for key, value in arrays.items() if key.startswith("state/")})
    return state


def config(family: harness.Family) -> harness.Config:
    return load_config(CONFIG)


def targets(arrays: harness.Arrays, step: int, rows: slice = slice(None)) -> Dict[str, torch.Tensor]:
    return {
        "label": torch.from_numpy(arrays[f"label_{step}"][rows]),
        "length": torch.from_numpy(arrays[f"length_{step}"][rows]),
    }


def batch(family: harness.Family, variant: harness.Variant) -> harness.Batch:
    return normalize(family.arrays["image_1"]), targets(family.arrays, 1)


def forward(family: harness.Family, run: harness.StepRun) -> harness.Comparison:
    return harness.Comparison(
        arrays={"logits": (run.outputs, family.arrays["logits_1"])},
        values={"loss": (run.losses["loss"], family.arrays["loss_1"])},
    )


def teacher(family: harness.Family, run: harness.StepRun) -> Dict[str, harness.Pair]:
    """CTC on Paddle's logits of both batches."""
    arrays = family.arrays
    return {
        f"loss_{step}": (
            run.loss_fn(torch.from_numpy(arrays[f"logits_{step}"]).float(), targets(arrays, step))["loss"],
            arrays[f"loss_{step}"],
        )
        for step in (1, 2)
    }


def ddp_worker(rank: int, store: str, out: str) -> None:
    """One of two gloo processes running ``ddp_step``. The step's DDP wrapper holds the gloo group
    in reference cycles: they are collected after the group is destroyed, while the interpreter is
    whole, after a barrier once the step succeeded (as ``ppdist.engine.dist.cleanup`` does; a gloo
    group torn down while the peer still uses it or during interpreter finalization can abort the
    process: "terminate called without an active exception")."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        ddp_step(rank, out)
        dist.barrier()  # as ppdist.engine.dist.cleanup: no process tears its connections down
    finally:  # while the other still uses them (rank 0 saving)
        dist.destroy_process_group()
        gc.collect()


def ddp_step(rank: int, out: str) -> None:
    """The fixture's first batch split as make_rec_dist.py splits it, under DDP with ppdist's
    defaults (rank 0's BatchNorm buffers broadcast, gradients averaged); rank 0 saves every rank's
    loss and its own gradients, norms and BatchNorm statistics to ``out``."""
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
    loss = build_loss(config)(logits, targets(fixture, 1, rows))["loss"]
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


def two_process_ddp_step_equals_paddles_data_parallel_step(family: harness.Family) -> None:
    """CTC's per-process batch mean, DDP's gradient average and per-process BatchNorm statistics
    are PaddleOCR's under paddle.DataParallel (fixture: 2 CPU processes, gloo)."""
    expected = load_arrays(DIST_FIXTURE)
    out = family.scratch / "ranks.pt"
    mp.spawn(ddp_worker, args=(str(family.scratch / "store"), str(out)), nprocs=WORLD)
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
    state = dict(family.state)
    state.update({k[len("bn_rank0/") :]: v for k, v in expected.items() if k.startswith("bn_rank0/")})
    bn_expected = to_torch(family.base, state)
    for key, ours in ranks[0]["bn"].items():
        theirs = bn_expected[key].double().numpy()
        assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max(), key


SPEC = harness.StepSpec(
    name="rec",
    fixture=lambda: load_arrays(FIXTURE),
    paddle_state=paddle_state,
    config=config,
    variants=(harness.FLOAT32,),
    batch=batch,
    forward=forward,
    teacher=teacher,
    teacher_tolerance=1e-4,
    # The bias of a BatchNorm whose output feeds a convolution and a training-mode BatchNorm has no
    # effect (the next BatchNorm removes the constant): its gradient is 0 up to rounding in both.
    zero_gradients=harness.ZeroGradients(ending="bn.bias"),
    statistics=2 * 47,
    replay=harness.Replay(tolerance=1e-5, steps_per_epoch=STEPS_PER_EPOCH),  # Adam
    schedules=(  # the quick start's Cosine + warmup
        harness.Schedule(
            "quickstart_lr",
            steps_per_epoch=250,
            config=lambda: load_config(QUICKSTART, ["Global.epoch_num=12"]),
        ),
    ),
    checks=(two_process_ddp_step_equals_paddles_data_parallel_step,),
    slow=frozenset({"two_process_ddp_step_equals_paddles_data_parallel_step"}),
)
