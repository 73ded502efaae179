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
import functools
import json
import os
from typing import Any, Dict

import numpy as np
import paddle_step_harness as harness
import torch
import yaml
from paddle_step_testing import load_arrays

from ppdist.components import build_loss
from ppdist.config import load_config

RECIPE = os.path.join(harness.ROOT, "configs", "table", "SLANet.yml")
LOSS_TERMS = ("loss", "structure_loss", "loc_loss")
OUTPUTS = ("structure_probs", "loc_preds")
SCRIPT = harness.fixture_script("make_table.py")


@functools.lru_cache(maxsize=None)
def manifest() -> Dict[str, Any]:
    with open(SCRIPT.MANIFEST, encoding="utf-8") as f:
        return json.load(f)


def paddle_state() -> harness.Arrays:
    return SCRIPT.synthetic_state(manifest()["tensors"], manifest()["seed"])


def recipe(**lr: Any) -> harness.Config:
    """configs/table/SLANet.yml at the fixture's size; ``lr`` keywords override ``Optimizer.lr``."""
    overrides = [  # Global's max_text_length reaches the head (and wins, as in PaddleOCR's transforms)
        f"Global.max_text_length={SCRIPT.MAX_TEXT_LENGTH}",
        f"Architecture.Head.max_text_length={SCRIPT.MAX_TEXT_LENGTH}",
        "Architecture.Backbone.pretrained=false",
    ]
    return load_config(RECIPE, overrides + [f"Optimizer.lr.{key}={value}" for key, value in lr.items()])


def fixture_batch(arrays: harness.Arrays) -> Dict[str, torch.Tensor]:
    return {
        key: torch.from_numpy(arrays[key]) for key in ("image", "structure", "bboxes", "bbox_masks", "shape")
    }


def batch(family: harness.Family, variant: harness.Variant) -> harness.Batch:
    """The fixture's batch, teacher-forced (the image in the variant's dtype)."""
    raw = fixture_batch(family.arrays)
    inputs = dict(raw, image=raw["image"].to(variant.dtype))
    return inputs, inputs


def paddle_terms(arrays: harness.Arrays, step: int) -> Dict[str, float]:
    return {key: float(arrays[f"loss_{step}/{key}"]) for key in LOSS_TERMS}


def forward(family: harness.Family, run: harness.StepRun) -> harness.Comparison:
    ours = {key: float(value.detach()) for key, value in run.losses.items()}
    assert set(ours) == set(LOSS_TERMS)
    return harness.Comparison(
        arrays={key: (run.outputs[key], family.arrays[f"{key}_1"]) for key in OUTPUTS},
        values={key: (ours[key], value) for key, value in paddle_terms(family.arrays, 1).items()},
    )


def teacher(family: harness.Family, run: harness.StepRun) -> Dict[str, harness.Pair]:
    """The loss alone: ppdist's SLALoss on PaddleOCR's teacher-forced outputs (float32 as stored;
    the loss computes in float32)."""
    preds = {key: torch.from_numpy(family.arrays[f"{key}_1"]).double() for key in OUTPUTS}
    ours = build_loss(family.config)(preds, fixture_batch(family.arrays))
    return {key: (float(ours[key]), value) for key, value in paddle_terms(family.arrays, 1).items()}


def the_shipped_recipe_is_the_one_paddleocr_ran(family: harness.Family) -> None:
    """configs/table/SLANet.yml's Architecture (but the size and the injected class count), Loss
    and Optimizer are PaddleOCR's SLANet.yml's, as make_table.py read them."""
    with open(RECIPE, encoding="utf-8") as f:
        ours = yaml.safe_load(f)
    theirs = copy.deepcopy(manifest()["recipe"])
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


def clip_norm_clips_some_gradients_at_every_step(family: harness.Family) -> None:
    """The fixture exercises the clip: at each step some gradient norms exceed clip_norm 5.0 (the
    first convolution's always; the global norm too: 50, 26, 19) and most do not."""
    arrays, positions = family.arrays, family.positions
    for step, count in zip(range(1, SCRIPT.STEPS + 1), (15, 9, 2)):
        norms = {owner: float(arrays[f"grad_norm_{step}/{owner}"]) for owner, _ in positions.values()}
        clipped = sorted(owner for owner, norm in norms.items() if norm > 5.0)
        assert len(clipped) == count and "backbone.conv1.conv.weight" in clipped, (step, clipped)
        assert np.sqrt(sum(norm**2 for norm in norms.values())) > 3 * 5.0


def lr_schedule(name: str, warmup: float) -> harness.Schedule:
    return harness.Schedule(
        name,
        steps_per_epoch=SCRIPT.STEPS_PER_EPOCH,
        config=functools.partial(recipe, warmup_epoch=warmup),
        length=SCRIPT.EPOCHS * SCRIPT.STEPS_PER_EPOCH,
    )


SPEC = harness.StepSpec(
    name="table",
    fixture=lambda: SCRIPT.unpack(load_arrays(SCRIPT.FIXTURE)),
    paddle_state=paddle_state,
    config=lambda family: recipe(),
    base_dtype=torch.float64,
    variants=(
        harness.FLOAT64,
        harness.FLOAT32,
    ),
    batch=batch,
    forward=forward,
    teacher=teacher,
    teacher_tolerance=1e-6,
    zero_gradients=harness.ZeroGradients(names=()),  # all 243, before the clip
    parameter_tensors=243,
    parameters=1875714,
    statistics_layers=73,
    # Three steps at the Piecewise schedule's 0.001, each gradient clipped to norm 5 by ppdist's
    # clipper, then Adam (beta 0.9 / 0.999, L2 0). Without the clip the replay misses Paddle's
    # update by far more than the tolerance.
    replay=harness.Replay(
        tolerance=1e-9,
        steps_per_epoch=SCRIPT.STEPS_PER_EPOCH,
        steps=SCRIPT.STEPS,
        clip=True,
        unclipped_error=1e-3,
    ),
    schedules=(lr_schedule("schedule_lr", 0), lr_schedule("schedule_lr_warmup", SCRIPT.WARMUP_EPOCH)),
    checks=(the_shipped_recipe_is_the_one_paddleocr_ran, clip_norm_clips_some_gradients_at_every_step),
    one_thread=True,  # the measured numbers above are with 1
)
