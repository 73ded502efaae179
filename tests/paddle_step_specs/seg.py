"""A PP-LiteSeg-T training step is PaddleSeg's training step: the three heads' OHEM losses and
kept pixels, gradients, BatchNorm statistics, the recipe's Momentum + L2 update and its LR
schedule, against tests/fixtures/paddle_step/seg.npz (written by PaddleSeg v2.9.1's own config
reader, builder, model, OhemCrossEntropyLoss and optimizer on paddlepaddle 2.6.2; make_seg.py).

The model is the real-size PP-LiteSeg-T of configs/seg/pp_liteseg_stdc1_cityscapes_1024x512_
scale0.5_160k.yml (seeded weights of tests/fixtures/paddle_seg, the seg heads' last conv x4 so
that OHEM drops pixels) on 2 images 3x96x192 in train mode (three heads), OHEM's ``min_kept`` set
to the fixture's 26573 (the recipe's 130000 exceeds the 36864 pixels: all would be kept). On
head 0 ``min_kept`` sets the threshold (0.81), on heads 1 and 2 0.7 does. The fixture was made in
float64; ppdist runs in float32 (how it trains) and in float64 (only its float32 loss rounds).
Measured (torch 2.14 CPU, 1 thread), relative errors:

=====================================================  ===========  ===========  =========
check                                                  float32      float64      tolerance
=====================================================  ===========  ===========  =========
loss on Paddle's logits, per head, steps 1 and 2 (a)   7.8e-8                    1e-4
OHEM alone, three seeded regimes (b)                   1.0e-7                    1e-4
loss from ppdist's forward, per head                   4.8e-7       7.8e-8       1e-4 / 1e-6
heads' logits before the resize (norm)                 7.3e-6       8.1e-8       1e-4 / 1e-6
sampled raw gradients, worst parameter (norm) (c)      1.8e-4       5.6e-7       1e-3 / 1e-5
BatchNorm running statistics after the forward (d)     7.4e-7       2.8e-8       1e-4 / 1e-6
Momentum 0.9 + L2 5e-4 replay, 2 steps (e)                          6.1e-8       1e-5
LR schedule, 3833 of the 160000 steps and 5 beyond     equal                     equal
=====================================================  ===========  ===========  =========

(a) teacher forcing: Paddle's heads' logits before the resize, resized by torch's bilinear
(half-pixel, as the model does); in every case OHEM keeps exactly Paddle's pixels. (b) ``min_kept``
sets the threshold / 0.7 does / fewer valid pixels than ``min_kept``. (c) Paddle's own float32
run is 2.5e-4 from its float64 one; the four SPPM conv biases, each followed by a training-mode
BatchNorm, have an exactly zero gradient in both (checked as such). (d) Paddle's rule, biased
batch variance (torch's unbiased rule: 6.4e-2, at the SPPM's 1x1 bin where N is the batch, 2).
(e) of each step's update, in float64 (a warmup update is ~1e-7 of its parameter); the rest is
float64 rounding of new - old at the SPPM conv biases, whose update is weight decay alone, 5e-9 of
the parameter (Paddle's own update matches lr x (g + 5e-4 p) in float64 to 5e-12 elsewhere). Deleting OHEM's 1e-5 in the denominator is caught by the float64 checks
only (a 1.3e-5 change). No Paddle is needed.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np
import paddle_step_harness as harness
import torch
import torch.nn.functional as F
from paddle_step_testing import load_arrays

from ppdist.components import build_loss
from ppdist.config import load_config

CONFIG = os.path.join(
    harness.ROOT, "configs", "seg", "pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml"
)
TOLERANCE = 1e-4
HEADS = tuple(f"head.seg_heads.{h}" for h in range(3))
MAKE = harness.fixture_script("make_seg.py")


def recipe(min_kept: Optional[int] = None) -> harness.Config:
    """The recipe's config; with ``min_kept`` its three OHEM losses keep at least that many pixels."""
    overrides = []
    if min_kept is not None:
        entry = f"{{name: OhemCrossEntropyLoss, thresh: 0.7, min_kept: {int(min_kept)}}}"
        overrides.append(f"Loss.types=[{entry}, {entry}, {entry}]")
    return load_config(CONFIG, overrides)


def label(arrays: harness.Arrays, step: int) -> torch.Tensor:
    return torch.from_numpy(arrays[f"label_{step}"].astype(np.int64))


def resized(head_logits: np.ndarray) -> torch.Tensor:
    """A head's logits at the input size, as the model resizes them (bilinear, half-pixel)."""
    return F.interpolate(
        torch.from_numpy(head_logits), (MAKE.HEIGHT, MAKE.WIDTH), mode="bilinear", align_corners=False
    )


def batch(family: harness.Family, variant: harness.Variant) -> harness.Batch:
    image = torch.from_numpy(MAKE.normalize(family.arrays["image_1"])).to(variant.dtype)
    return image, {"label": label(family.arrays, 1)}


def same_pixels_kept(
    loss_fn: torch.nn.Module, h: int, logit: torch.Tensor, target: torch.Tensor, packed: np.ndarray
) -> bool:
    """Whether ppdist's OHEM of head ``h`` keeps exactly the pixels of the fixture's packed mask."""
    ours = loss_fn.losses[h].kept_mask(logit.float(), target).numpy()
    theirs = np.unpackbits(packed, count=ours.size).reshape(ours.shape).astype(bool)
    return bool(np.array_equal(ours, theirs))


def forward(family: harness.Family, run: harness.StepRun) -> harness.Comparison:
    """Each head's loss and kept pixels, the total, and the heads' logits before the resize."""
    arrays, target, compared = family.arrays, label(family.arrays, 1), harness.Comparison()
    for h, head in enumerate(HEADS):
        compared.values[f"loss_{h}"] = (run.losses[f"loss_{h}"], arrays[f"loss_1_{h}"])
        compared.arrays[head] = (run.captured[head], arrays[f"head_logits_1_{h}"])
        assert same_pixels_kept(run.loss_fn, h, run.outputs[h].detach(), target, arrays[f"kept_1_{h}"]), h
    compared.values["loss"] = (run.losses["loss"], arrays["loss_1"])
    return compared


def teacher(family: harness.Family, run: harness.StepRun) -> Dict[str, harness.Pair]:
    """Teacher forcing: ppdist's MultiOutputLoss on Paddle's three heads' logits, both steps, and
    its OHEM on three seeded logit sets (``min_kept`` / 0.7 sets the threshold / all kept); OHEM
    keeps exactly Paddle's pixels in each."""
    arrays, loss_fn, compared = family.arrays, build_loss(family.config), {}
    for step in (1, 2):
        logits = [resized(arrays[f"head_logits_{step}_{h}"]) for h in range(3)]
        target = label(arrays, step)
        ours = loss_fn(logits, {"label": target})
        for h in range(3):
            compared[f"step {step}: loss_{h}"] = (ours[f"loss_{h}"], arrays[f"loss_{step}_{h}"])
            assert same_pixels_kept(loss_fn, h, logits[h], target, arrays[f"kept_{step}_{h}"]), (step, h)
        compared[f"step {step}: loss"] = (ours["loss"], arrays[f"loss_{step}"])
    for i in range(3):
        logits, target = MAKE.teacher_case(i, arrays["label_1"].astype(np.int64))
        logits, target = torch.from_numpy(logits), torch.from_numpy(target)
        compared[f"OHEM case {i}"] = (loss_fn.losses[0](logits, target), arrays[f"teacher_loss_{i}"])
        assert same_pixels_kept(loss_fn, 0, logits, target, arrays[f"teacher_kept_{i}"]), i
    return compared


def recipe_losses_and_optimizer_are_paddlesegs(family: harness.Family) -> None:
    """What make_seg.py found in PaddleSeg's config and builder (3 x OHEM thresh 0.7, min_kept
    130000, coef [1, 1, 1]; Momentum 0.9 with weight_decay 5e-4; LinearWarmup + PolynomialDecay)."""
    config = recipe()
    ohem = {"name": "OhemCrossEntropyLoss", "thresh": 0.7, "min_kept": 130000}
    assert config["Loss"]["types"] == [ohem] * 3 and config["Loss"]["coef"] == [1, 1, 1]
    section = config["Optimizer"]
    assert (section["name"], section["momentum"], section["weight_decay"]) == ("Momentum", 0.9, 5e-4)
    assert section["lr"] == {
        "name": "PolynomialDecay",
        "learning_rate": 0.005,
        "end_lr": 0.0,
        "power": 0.9,
        "warmup_iters": 1000,
        "warmup_start_lr": 1e-5,
    }
    assert config["Global"]["max_iters"] == MAKE.ITERS


SPEC = harness.StepSpec(
    name="seg",
    fixture=lambda: load_arrays(os.path.join(harness.STEP_DIR, "seg.npz")),
    paddle_state=MAKE.paddle_state,
    config=lambda family: recipe(family.arrays["min_kept"]),
    # float32: how ppdist trains; float64: as the fixture was made, so only ppdist's float32 loss rounds
    variants=(
        harness.FLOAT32,
        harness.FLOAT64,
    ),
    batch=batch,
    capture=HEADS,
    forward=forward,
    teacher=teacher,
    teacher_tolerance=TOLERANCE,
    # A conv bias followed by a training-mode BatchNorm has no effect (the BatchNorm removes the
    # constant): the four SPPM conv biases have a zero gradient up to rounding in both.
    zero_gradients=harness.ZeroGradients(
        names=(
            "head.cm.conv_out.conv.bias",
            "head.cm.stages.0.1.conv.bias",
            "head.cm.stages.1.1.conv.bias",
            "head.cm.stages.2.1.conv.bias",
        )
    ),
    parameter_tensors=151,
    statistics=2 * 48,
    replay=harness.Replay(
        tolerance=1e-5, steps_per_epoch=1000, groups=(("weight_decay", 5e-4), ("momentum", 0.9))
    ),
    schedules=(  # LinearWarmup + PolynomialDecay
        harness.Schedule(
            "lr_values", steps_per_epoch=1000, config=recipe, index="lr_index", beyond=MAKE.ITERS
        ),
    ),
    checks=(recipe_losses_and_optimizer_are_paddlesegs,),
    # One intra-op thread: the step is small, and 2 threads on a shared 2-core CI machine are
    # slower (the measured numbers above are with 1).
    one_thread=True,
)
