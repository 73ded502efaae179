"""A SegFormer-B0 training step is PaddleSeg's training step: the cross-entropy loss, logits,
gradients, the head's BatchNorm statistics, the recipe's AdamW update and its LR schedule, against
tests/fixtures/paddle_step/segformer.npz (written by PaddleSeg d7975e7c's own config reader,
builder, SegFormer, CrossEntropyLoss, AdamW and PolynomialDecay on paddlepaddle 2.6.2;
make_segformer.py).

The model is the real-size SegFormer-B0 of configs/seg/segformer_b0_cityscapes_1024x1024_160k.yml
(19 classes, embedding_dim 256; seeded weights of tests/fixtures/paddle_segformer) on 2 images
3x64x128 in train mode with stochastic depth and dropout off on both sides
(``Architecture.Backbone.drop_path_rate=0``, the head's dropout in eval mode; PaddleSeg:
``reset_drop_path(0.0)``). The fixture was made in float64; ppdist runs in float32 (how it
trains) and in float64 (only its float32 loss rounds). Measured (torch 2.14 CPU, 1 thread),
relative errors:

=====================================================  ===========  ===========  =========
check                                                  float32      float64      tolerance
=====================================================  ===========  ===========  =========
loss on Paddle's logits (a)                            5.3e-8                    1e-4
loss from ppdist's forward                             5.3e-8       5.3e-8       1e-4 / 1e-6
logits before the resize (norm)                        1.1e-6       2.4e-13      1e-4 / 1e-6
sampled raw gradients, worst parameter (norm) (b)      2.8e-5       1.1e-8       1e-3 / 1e-5
BatchNorm running statistics after the forward (c)     1.0e-7       1.7e-8       1e-4 / 1e-6
AdamW replay, 2 steps (d)                                           4.5e-8       1e-5
LR schedule, 2052 steps: 0-300, every 97th, the end    equal                     equal
=====================================================  ===========  ===========  =========

(a) teacher forcing: Paddle's ``linear_pred`` logits, resized by torch's bilinear (half-pixel, as
the model does); 9.4% of the pixels are ignored (averaging over all pixels instead: 9.4e-2).
ppdist's loss computes in float32: that sets its float64 loss and gradient figures. (b) Paddle's own float32 run
is 5.9e-6 from its float64 one; five parameters whose output only adds a per-channel constant
before the training-mode ``linear_fuse`` BatchNorm (the four ``linear_c*`` embedding biases and
``norm4``'s bias, which reaches the head only through ``linear_c4``) have an exactly zero gradient
in both (checked as such). (c) Paddle's rule, biased batch variance (torch's unbiased rule: 7.4e-5,
caught in float64); the 1.7e-8 is Paddle's momentum 0.9 taken as float32 (with 0.9f: 1e-14).
(d) of each step's update, in float64: decoupled weight decay 0.01 on every parameter, norms and
biases included (PaddleSeg passes no ``apply_decay_param_fun``; leaving 1-D parameters undecayed:
2.0), then Adam with beta1 0.9, beta2 0.999, eps 1e-8; the rest is Paddle's float32 LR. The LR
is PolynomialDecay 6e-5, power 1, to 0 at step 160000 and after. No Paddle is needed.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Dict, List

import numpy as np
import paddle_step_harness as harness
import torch
import torch.nn.functional as F
from paddle_step_testing import load_arrays
from torch import nn

from ppdist.components import build_loss
from ppdist.config import load_config
from ppdist.modeling.layers import DropPath

CONFIG = os.path.join(harness.ROOT, "configs", "seg", "segformer_b0_cityscapes_1024x1024_160k.yml")
TOLERANCE = 1e-4
LOGITS = "head.linear_pred"  # the logits before the resize
MAKE = harness.fixture_script("make_segformer.py")


@functools.lru_cache(maxsize=None)
def images() -> List[np.ndarray]:
    return MAKE.images()


def recipe(**backbone: Any) -> harness.Config:
    """The recipe's config; ``backbone`` keywords override ``Architecture.Backbone``."""
    return load_config(CONFIG, [f"Architecture.Backbone.{key}={value}" for key, value in backbone.items()])


def label(arrays: harness.Arrays, step: int) -> torch.Tensor:
    return torch.from_numpy(arrays[f"label_{step}"].astype(np.int64))


def resized(head_logits: np.ndarray) -> torch.Tensor:
    """``linear_pred``'s logits at the input size, as the model resizes them (bilinear, half-pixel)."""
    return F.interpolate(
        torch.from_numpy(head_logits), (MAKE.HEIGHT, MAKE.WIDTH), mode="bilinear", align_corners=False
    )


def train_without_noise(model: torch.nn.Module) -> None:
    """Training mode (BatchNorm on batch statistics) with the head's channel dropout off (the
    config's drop_path_rate 0 leaves no stochastic depth; drop_rate / attn_drop_rate are 0)."""
    model.train()
    model.head.dropout.eval()
    assert not [m for m in model.modules() if isinstance(m, DropPath)]
    noisy = [
        m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0
    ]
    noisy += [
        m for m in model.modules() if isinstance(getattr(m, "attn_drop", None), float) and m.attn_drop > 0
    ]
    assert not noisy, noisy


def batch(family: harness.Family, variant: harness.Variant) -> harness.Batch:
    image = torch.from_numpy(MAKE.normalize(images()[0])).to(variant.dtype)
    return image, {"label": label(family.arrays, 1)}


def forward(family: harness.Family, run: harness.StepRun) -> harness.Comparison:
    assert run.outputs[0].shape == (MAKE.BATCH, MAKE.NUM_CLASSES, MAKE.HEIGHT, MAKE.WIDTH)
    return harness.Comparison(
        arrays={LOGITS: (run.captured[LOGITS], family.arrays["head_logits_1"])},
        values={"loss": (run.losses["loss"], family.arrays["loss_1"])},
    )


def teacher(family: harness.Family, run: harness.StepRun) -> Dict[str, harness.Pair]:
    """Teacher forcing: ppdist's loss on Paddle's logits (10% of the pixels ignored)."""
    arrays = family.arrays
    ours = build_loss(family.config)([resized(arrays["head_logits_1"])], {"label": label(arrays, 1)})
    return {"loss": (ours["loss"].item(), arrays["loss_1"])}


def recipe_loss_and_optimizer_are_paddlesegs(family: harness.Family) -> None:
    """What make_segformer.py found in PaddleSeg's config and builder (one CrossEntropyLoss, coef
    [1]; AdamW beta1 0.9, beta2 0.999, weight_decay 0.01; PolynomialDecay 6e-5, power 1, end_lr 0
    over the 160000 iterations, no warmup) and the model the step used."""
    config = recipe()
    assert config["Loss"]["types"] == [{"name": "CrossEntropyLoss"}] and config["Loss"]["coef"] == [1]
    section = config["Optimizer"]
    assert (section["name"], section["beta1"], section["beta2"], section["weight_decay"]) == (
        "AdamW",
        0.9,
        0.999,
        0.01,
    )
    assert section["lr"] == {"name": "PolynomialDecay", "learning_rate": 6e-5, "end_lr": 0.0, "power": 1.0}
    assert config["Global"]["max_iters"] == MAKE.ITERS
    architecture = config["Architecture"]
    assert architecture["Backbone"] == {"name": "MixVisionTransformer_B0"}
    assert (architecture["Head"]["name"], architecture["Head"]["embedding_dim"]) == ("SegFormerHead", 256)


SPEC = harness.StepSpec(
    name="segformer",
    fixture=lambda: load_arrays(os.path.join(harness.STEP_DIR, "segformer.npz")),
    paddle_state=MAKE.paddle_state,
    config=lambda family: recipe(drop_path_rate=0.0),
    # float32: how ppdist trains; float64: as the fixture was made, so only ppdist's float32 loss rounds
    variants=(
        harness.FLOAT32,
        harness.FLOAT64,
    ),
    batch=batch,
    prepare=train_without_noise,
    capture=(LOGITS,),
    forward=forward,
    teacher=teacher,
    teacher_tolerance=TOLERANCE,
    # What only adds a per-channel constant before the training-mode ``linear_fuse`` BatchNorm has
    # no effect: the four embedding biases and the last backbone LayerNorm's bias have a zero
    # gradient up to rounding in both.
    zero_gradients=harness.ZeroGradients(
        names=(
            "backbone.norm4.bias",
            "head.linear_c1.proj.bias",
            "head.linear_c2.proj.bias",
            "head.linear_c3.proj.bias",
            "head.linear_c4.proj.bias",
        )
    ),
    parameter_tensors=189,
    statistics_layers=1,
    statistics=2,
    # an update is ~1e-4 of the parameter: float64
    replay=harness.Replay(
        tolerance=1e-5,
        steps_per_epoch=1000,
        steps=MAKE.STEPS,
        groups=(("weight_decay", 0.01), ("betas", (0.9, 0.999)), ("eps", 1e-8)),
        every_parameter=True,
    ),
    schedules=(  # PolynomialDecay, no warmup
        harness.Schedule(
            "lr_values", steps_per_epoch=1000, config=recipe, index="lr_index", beyond=MAKE.ITERS
        ),
    ),
    checks=(recipe_loss_and_optimizer_are_paddlesegs,),
    # One intra-op thread: the step is small, and 2 threads on a shared 2-core CI machine are
    # slower (the measured numbers above are with 1).
    one_thread=True,
)
