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

from __future__ import annotations

import os
from typing import Dict, Sequence

import paddle_step_harness as harness
import torch
from paddle_step_testing import load_arrays
from ppdist_testing import paddle_fixture_script

from ppdist.config import load_config

CONFIG = os.path.join(harness.ROOT, "configs", "det", "ppyoloe_crn_s_300e_coco.yml")
FIXTURE = os.path.join(harness.STEP_DIR, "det.npz")
PHASES = {"atss": 0, "tal": 100}  # the epoch_id of each assigner phase
TERMS = ("loss", "loss_cls", "loss_iou", "loss_dfl", "loss_l1")
MAKE = harness.fixture_script("make_det.py")


def paddle_state() -> harness.Arrays:
    return MAKE.det_state(paddle_fixture_script("det"))


def config(family: harness.Family) -> harness.Config:
    return load_config(CONFIG)


def targets(epoch_id: int) -> Dict[str, torch.Tensor]:
    gt_class, gt_bbox, pad = MAKE.ground_truth()
    return {
        "gt_class": torch.from_numpy(gt_class),
        "gt_bbox": torch.from_numpy(gt_bbox),
        "pad_gt_mask": torch.from_numpy(pad),
        "epoch_id": epoch_id,
    }


def batch(family: harness.Family, variant: harness.Variant) -> harness.Batch:
    """The fixture's image (float32) and ground truth in the variant's assigner phase."""
    image = (torch.from_numpy(family.arrays["image"]).double() / 255.0).float()
    return {"image": image}, targets(PHASES[variant.name])


def renumbered(arrays: harness.Arrays, phases: Sequence[str]) -> harness.Arrays:
    """The fixture with the arrays of ``phases`` (``grad_atss/``, ...) as steps 1, 2, ... (``grad_1/``)."""
    renamed = {
        key.replace(f"_{phase}/", f"_{step}/"): value
        for step, phase in enumerate(phases, 1)
        for key, value in arrays.items()
        if f"_{phase}/" in key
    }
    return dict(arrays, **renamed)


def forward(family: harness.Family, run: harness.StepRun) -> harness.Comparison:
    phase = run.variant.name
    return harness.Comparison(
        arrays={"cls_logits": (run.outputs["cls_logits"], family.arrays["cls_logits"])},
        values={term: (run.losses[term], family.arrays[f"loss_{phase}/{term}"]) for term in TERMS},
    )


def teacher(family: harness.Family, run: harness.StepRun) -> Dict[str, harness.Pair]:
    """Every loss term on PaddleDetection's head outputs, in the variant's phase."""
    phase = run.variant.name
    preds = {k: v.detach() if torch.is_tensor(v) else v for k, v in run.outputs.items()}
    preds["cls_logits"] = torch.from_numpy(family.arrays["cls_logits"])
    preds["reg_distri"] = torch.from_numpy(family.arrays["reg_distri"])
    ours = run.loss_fn(preds, targets(PHASES[phase]))
    return {term: (ours[term].item(), family.arrays[f"loss_{phase}/{term}"]) for term in TERMS}


TOLERANCE = harness.Tolerance(outputs=1e-4, loss=1e-4, gradients=1e-3, statistics=1e-4)

SPEC = harness.StepSpec(
    name="det",
    fixture=lambda: load_arrays(FIXTURE),
    paddle_state=paddle_state,
    config=config,
    # the training forward and backward of each assigner phase, float32 (as the fixture's)
    variants=tuple(harness.Variant(phase, torch.float32, TOLERANCE) for phase in sorted(PHASES)),
    batch=batch,
    forward=forward,
    teacher=teacher,
    teacher_tolerance=1e-4,
    teacher_variants=tuple(sorted(PHASES)),
    statistics_variants=("atss",),  # the BatchNorm statistics after the first forward
    step_arrays=lambda arrays, phase: renumbered(arrays, (phase,)),
    zero_gradients=harness.ZeroGradients(),  # a few BatchNorm biases (ATSS: 7, TAL: 1)
    # Paddle's ATSS then TAL gradients through ppdist's Momentum + L2 at the recipe's LR from the
    # end of the warmup, each step followed by the EMA update (float64, as the fixture's replay)
    replay=harness.Replay(
        tolerance=1e-5,
        steps_per_epoch=MAKE.STEPS_PER_EPOCH,
        start_step=MAKE.REPLAY_FROM,
        ema_tolerance=1e-5,
        arrays=lambda arrays: renumbered(arrays, ("atss", "tal")),
    ),
    schedules=(harness.Schedule("lr_values", steps_per_epoch=MAKE.STEPS_PER_EPOCH, lr_at=MAKE.lr_steps),),
)
