"""An OCRNet-HRNet_W18 training step is PaddleSeg's training step: the main and auxiliary (soft
object regions) cross-entropy losses with coef [1, 0.4], gradients, BatchNorm statistics, the
recipe's Momentum + L2 update and its LR schedule, against tests/fixtures/paddle_step/ocrnet.npz
(written by PaddleSeg's own config reader, builder, OCRNet + HRNet_W18, CrossEntropyLoss and
optimizer on paddlepaddle 2.6.2; make_ocrnet.py).

The model is the real-size OCRNet-HRNet_W18 of configs/seg/ocrnet_hrnetw18_cityscapes_1024x512_
160k.yml (19 classes; the seeded weights of tests/fixtures/paddle_ocrnet) on 2 images 3x64x128 in
train mode, the head's Dropout2d at p 0 on both sides (a random mask cannot be reproduced across
frameworks). The fixture was made in float64; ppdist runs in float32 (how it trains) and in
float64 (only its float32 loss rounds). Measured (torch 2.14 CPU, 1 thread), relative errors:

=====================================================  ===========  ===========  =========
check                                                  float32      float64      tolerance
=====================================================  ===========  ===========  =========
loss on Paddle's logits, per output + total, 2 steps   3.2e-8                    1e-6
loss from ppdist's forward, per output + total         6.5e-7       3.2e-8       1e-4 / 1e-6
head's two outputs before the resize (norm) (a)        4.0e-5       2.5e-8       1e-4 / 1e-6
sampled raw gradients, worst parameter (norm) (b)      5.6e-2       7.8e-8       (b) / 1e-5
  the same, median over the 946 non-zero parameters    6.8e-3       5.5e-8       (b)
BatchNorm running statistics, all 314 (c)              4.1e-6       6.7e-8       1e-4 / 1e-6
Momentum 0.9 + L2 4e-5 replay, 2 steps (d)                          8.6e-8       1e-5
poly 0.9 LR schedule, 2052 step counts (e)             equal                     equal
=====================================================  ===========  ===========  =========

(a) The fixture stores them in float32 (2.5e-8 is that rounding). (b) Train-mode BatchNorm on
few values (HRNet's 1/32 branch is 2x4 here: 16 values a channel) amplifies float32 rounding:
Paddle's own float32 gradients are 6.1e-2 (worst) and 3.9e-3 (median) from its float64 ones. In
float32, ppdist's worst must be within 2x Paddle's worst and its median within 3x Paddle's
median, full norms within 5e-2 (worst 1.1e-2); the float64 run is the exact check. The nine head
conv biases followed by a training-mode BatchNorm have an exactly zero gradient in both (checked
as such). (c) Paddle's rule, biased batch variance (torch's unbiased rule: 1.0e-2 off, at the
1/32 branch). (d) of each step's update, in float64; leaving out the L2 term changes the nine
zero-gradient biases' update entirely (1.5 relative). (e) 0-300, every 97th from 301, then every
step from 159900 to 160004 (0 from 160000 on). Training with the head's Dropout2d on (p 0.1)
would move the loss by 2.9e-3. No Paddle is needed.
"""

from __future__ import annotations

import os
from typing import Dict

import numpy as np
import paddle_step_harness as harness
import torch
import torch.nn.functional as F
from paddle_step_testing import load_arrays

from ppdist.components import build_loss
from ppdist.config import load_config

CONFIG = os.path.join(harness.ROOT, "configs", "seg", "ocrnet_hrnetw18_cityscapes_1024x512_160k.yml")
TOLERANCE = 1e-4
HEADS = ("head.cls_head", "head.aux_head")  # the head's two outputs before the resize
MAKE = harness.fixture_script("make_ocrnet.py")


def label(arrays: harness.Arrays, step: int) -> torch.Tensor:
    return torch.from_numpy(arrays[f"label_{step}"].astype(np.int64))


def resized(head_logits: np.ndarray) -> torch.Tensor:
    """A head output at the input size, as the model resizes it (bilinear, half-pixel), in float64."""
    return F.interpolate(
        torch.from_numpy(head_logits.astype(np.float64)),
        (MAKE.HEIGHT, MAKE.WIDTH),
        mode="bilinear",
        align_corners=False,
    )


def without_dropout(model: torch.nn.Module) -> None:
    """The head's Dropout2d at p 0 (the fixture's too)."""
    dropout = model.head.spatial_ocr.conv1x1[1]
    assert isinstance(dropout, torch.nn.Dropout2d) and dropout.p == 0.1
    dropout.p = 0.0


def batch(family: harness.Family, variant: harness.Variant) -> harness.Batch:
    image = torch.from_numpy(MAKE.normalize(family.arrays["image_1"])).to(variant.dtype)
    return image, {"label": label(family.arrays, 1)}


def forward(family: harness.Family, run: harness.StepRun) -> harness.Comparison:
    """Each output's coef x cross entropy, the total, and the head's two outputs before the resize."""
    arrays, compared = family.arrays, harness.Comparison()
    assert [tuple(out.shape) for out in run.outputs] == [(2, 19, MAKE.HEIGHT, MAKE.WIDTH)] * 2
    for h, head in enumerate(HEADS):
        compared.values[f"loss_{h}"] = (run.losses[f"loss_{h}"], arrays[f"loss_1_{h}"])
        compared.arrays[head] = (run.captured[head], arrays[f"head_logits_1_{h}"])
    compared.values["loss"] = (run.losses["loss"], arrays["loss_1"])
    return compared


def teacher(family: harness.Family, run: harness.StepRun) -> Dict[str, harness.Pair]:
    """Teacher forcing: ppdist's MultiOutputLoss on the head outputs Paddle's loss was given (the
    float32-stored outputs, resized as the model does), both steps: each output's coef x cross
    entropy and the total."""
    arrays, loss_fn, compared = family.arrays, build_loss(family.config), {}
    for step in (1, 2):
        ours = loss_fn(
            [resized(arrays[f"head_logits_{step}_{h}"]) for h in range(2)], {"label": label(arrays, step)}
        )
        for h in range(2):
            compared[f"step {step}: loss_{h}"] = (ours[f"loss_{h}"], arrays[f"teacher_loss_{step}_{h}"])
        compared[f"step {step}: loss"] = (ours["loss"], arrays[f"teacher_loss_{step}"])
    return compared


def recipe_losses_and_optimizer_are_paddlesegs(family: harness.Family) -> None:
    """What make_ocrnet.py found in PaddleSeg's config and builder (2 x CrossEntropyLoss, coef
    [1, 0.4]; Momentum 0.9 with weight_decay 4e-5; PolynomialDecay 0.01, power 0.9, to 0)."""
    config = family.config
    assert config["Loss"] == {
        "name": "MultiOutputLoss",
        "types": [{"name": "CrossEntropyLoss"}, {"name": "CrossEntropyLoss"}],
        "coef": MAKE.COEF,
    }
    section = config["Optimizer"]
    assert (section["name"], section["momentum"], section["weight_decay"]) == ("Momentum", 0.9, 4e-5)
    assert section["lr"] == {"name": "PolynomialDecay", "learning_rate": 0.01, "end_lr": 0.0, "power": 0.9}
    assert config["Global"]["max_iters"] == MAKE.ITERS


SPEC = harness.StepSpec(
    name="ocrnet",
    fixture=lambda: MAKE.unpack(load_arrays(os.path.join(harness.STEP_DIR, "ocrnet.npz"))),
    paddle_state=MAKE.paddle_state,
    config=lambda family: load_config(CONFIG),
    # float32: how ppdist trains; float64: as the fixture was made, so only ppdist's float32 loss
    # rounds. float32 gradients: ppdist's rounding errors are distributed as Paddle's own float32
    # run's (worst within 2x Paddle's, median within 3x), full norms within 5e-2; float64: each
    # gradient within 1e-5, full norms too.
    variants=(
        harness.Variant(
            "float32",
            torch.float32,
            harness.Tolerance(
                outputs=TOLERANCE,
                loss=TOLERANCE,
                gradients=None,
                statistics=TOLERANCE,
                norms=5e-2,
                paddle_float32=(2.0, 3.0),
            ),
        ),
        harness.Variant(
            "float64",
            torch.float64,
            harness.Tolerance(outputs=1e-6, loss=1e-6, gradients=1e-5, statistics=1e-6, norms=1e-5),
        ),
    ),
    batch=batch,
    prepare=without_dropout,
    capture=HEADS,
    forward=forward,
    teacher=teacher,
    teacher_tolerance=1e-6,
    zero_gradients=harness.ZeroGradients(  # conv biases followed by a training-mode BatchNorm
        names=(
            "head.aux_head.0.conv.bias",
            "head.conv3x3_ocr.conv.bias",
            "head.spatial_ocr.attention_block.f_down.conv.bias",
            "head.spatial_ocr.attention_block.f_object.0.conv.bias",
            "head.spatial_ocr.attention_block.f_object.1.conv.bias",
            "head.spatial_ocr.attention_block.f_pixel.0.conv.bias",
            "head.spatial_ocr.attention_block.f_pixel.1.conv.bias",
            "head.spatial_ocr.attention_block.f_up.conv.bias",
            "head.spatial_ocr.conv1x1.0.conv.bias",
        )
    ),
    parameter_tensors=955,
    statistics_layers=314,
    statistics=2 * 314,
    replay=harness.Replay(
        tolerance=1e-5, steps_per_epoch=1000, groups=(("weight_decay", 4e-5), ("momentum", 0.9))
    ),
    schedules=(  # poly 0.9 to 0
        harness.Schedule(
            "lr_values",
            steps_per_epoch=1000,
            index="lr_index",
            beyond=MAKE.ITERS,
            ends=(0.01, 0.0),
        ),
    ),
    checks=(recipe_losses_and_optimizer_are_paddlesegs,),
    one_thread=True,  # the measured numbers above are with 1
)
