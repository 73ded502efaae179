"""A Cascade R-CNN R50-FPN training step (PaddleDetection release/2.7.1's
configs/cascade_rcnn/cascade_rcnn_r50_fpn_1x_coco.yml loaded unchanged, sampling made
deterministic with ``use_random: false``) is PaddleDetection's: each stage's RoIs (stage 0 the
sampled proposals, stages 1 and 2 the previous stage's refined boxes) with their labels, box
logits and deltas, every loss term (RPN and the three stages'), gradients, Momentum + L2 and the
LR schedule, against tests/fixtures/paddle_step/cascade_rcnn.npz (written by PaddleDetection's
own code on paddlepaddle 2.6.2: make_cascade_rcnn.py; the images, ground truth and weight rule
are the Faster R-CNN fixture's). No Paddle is needed.

69.1 M trainable parameters (PaddleDetection's count), so the model is built in float64 to hold
the sampled indices and trains in float32, as the fixture's. Measured (torch 2.14 CPU, float32):
see docs/detection.md, "Cascade R-CNN".
"""

from __future__ import annotations

import os
from typing import Dict

import numpy as np
import paddle_step_harness as harness
import torch
from faster_rcnn_testing import CASCADE_R50_FPN
from paddle_step_testing import load_arrays

from paddle_step_specs.faster_rcnn import same_gradients_twice
from ppdist.convert.configs.convert import load_config

FIXTURE = os.path.join(harness.STEP_DIR, "cascade_rcnn.npz")
STAGES = 3
TERMS = ("loss", "loss_rpn_cls", "loss_rpn_reg") + tuple(
    f"loss_bbox_{kind}_stage{s}" for s in range(STAGES) for kind in ("cls", "reg")
)
MAKE = harness.fixture_script("make_cascade_rcnn.py")
DETERMINISTIC = [
    "Architecture.Head.rpn_head.rpn_target_assign.use_random=false",
    "Architecture.Head.bbox_head.bbox_assigner.use_random=false",
    "Loss.rpn_target_assign.use_random=false",
]


def config(family: harness.Family) -> harness.Config:
    """The release config as ``tools/train.py -c`` reads it, samplers in order."""
    return load_config(CASCADE_R50_FPN, DETERMINISTIC)


def targets() -> Dict[str, torch.Tensor]:
    gt_class, gt_bbox, pad = MAKE.ground_truth()
    return {
        "gt_class": torch.from_numpy(gt_class),
        "gt_bbox": torch.from_numpy(gt_bbox),
        "pad_gt_mask": torch.from_numpy(pad),
    }


def batch(family: harness.Family, variant: harness.Variant) -> harness.Batch:
    image = torch.from_numpy(family.arrays["image"]).to(variant.dtype)
    inputs = {
        "image": image,
        "im_shape": torch.tensor(MAKE.IM_SHAPES),
        "scale_factor": torch.ones(2, 2),
        **targets(),
    }
    return inputs, targets()


def per_image(family: harness.Family, run: harness.StepRun, key: str, stage: int) -> np.ndarray:
    """The fixture's concatenated per-RoI rows of ``key`` at ``stage`` in ppdist's [B, R, ...]
    layout (the stage's mask: Paddle drops the slots ppdist masks)."""
    mask = run.outputs[f"rois_mask_stage{stage}"].numpy()
    rows = np.split(
        family.arrays[f"{key}_stage{stage}"], np.cumsum(family.arrays[f"rois_num_stage{stage}"])[:-1]
    )
    out = np.zeros(mask.shape + rows[0].shape[1:], dtype=rows[0].dtype)
    for image, part in enumerate(rows):
        assert int(mask[image].sum()) == len(part), (key, stage, image)
        out[image][mask[image]] = part
    return out


def aligned(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """The fixture's row of each of ppdist's RoIs [N, 4]: the identity but for RoIs whose proposal
    objectness ties within float32 rounding, whose order flips with the intra-op thread count (at
    one thread two adjacent background RoIs of image 2 swap places, in every stage)."""
    distance = np.abs(ours[:, None, :] - theirs[None, :, :]).max(-1)
    order = distance.argmin(1)
    assert np.array_equal(np.sort(order), np.arange(len(order))), "not the same RoIs"
    assert distance[np.arange(len(order)), order].max() < 1e-3
    assert np.count_nonzero(order != np.arange(len(order))) <= 2, np.flatnonzero(
        order != np.arange(len(order))
    )
    return order


def in_our_order(family: harness.Family, run: harness.StepRun, key: str, stage: int) -> np.ndarray:
    """``per_image`` with the RoIs in ppdist's order (``aligned``)."""
    mask = run.outputs[f"rois_mask_stage{stage}"].numpy()
    rois = run.outputs[f"rois_stage{stage}"].detach().numpy()[mask]
    order = aligned(rois, per_image(family, run, "rois", stage)[mask])
    rows = per_image(family, run, key, stage)
    rows[mask] = rows[mask][order]
    return rows


def forward(family: harness.Family, run: harness.StepRun) -> harness.Comparison:
    """Every stage's RoIs (in order, up to a tie), labels exactly, box logits and deltas; every
    loss term."""
    arrays = {}
    for stage in range(STAGES):
        mask = run.outputs[f"rois_mask_stage{stage}"]
        labels = run.outputs["tgt_labels" + (f"_stage{stage}" if stage else "")]
        assert np.array_equal(labels[mask].numpy(), in_our_order(family, run, "labels", stage)[mask.numpy()])
        for key in ("rois", "bbox_score", "bbox_delta"):
            arrays[f"{key}_stage{stage}"] = (
                run.outputs[f"{key}_stage{stage}"][mask],
                in_our_order(family, run, key, stage)[mask.numpy()],
            )
    return harness.Comparison(
        arrays=arrays, values={term: (run.losses[term], family.arrays[f"loss/{term}"]) for term in TERMS}
    )


def teacher(family: harness.Family, run: harness.StepRun) -> Dict[str, harness.Pair]:
    """The stages' loss terms on PaddleDetection's box logits and deltas (on the same RoIs)."""
    preds = {k: v.detach() if torch.is_tensor(v) else v for k, v in run.outputs.items()}
    for stage in range(STAGES):
        for key in ("bbox_score", "bbox_delta"):
            preds[f"{key}_stage{stage}"] = torch.from_numpy(in_our_order(family, run, key, stage))
    ours = run.loss_fn(preds, targets())
    return {term: (ours[term].item(), family.arrays[f"loss/{term}"]) for term in TERMS if "bbox" in term}


TOLERANCE = harness.Tolerance(outputs=1e-4, loss=1e-4, gradients=1e-3, statistics=1e-4)

SPEC = harness.StepSpec(
    name="cascade_rcnn",
    fixture=lambda: load_arrays(FIXTURE),
    paddle_state=MAKE.cascade_rcnn_state,
    config=config,
    variants=(harness.Variant("float32", torch.float32, TOLERANCE),),
    base_dtype=torch.float64,
    batch=batch,
    forward=forward,
    teacher=teacher,
    teacher_tolerance=1e-5,
    statistics_variants=(),  # every BatchNorm is frozen (freeze_norm)
    # P4 and P5's output convolutions, as in the Faster R-CNN fixture: every sampled anchor and RoI lies on P2-P3
    zero_gradients=harness.ZeroGradients(
        names=(
            "neck.fpn_res4_sum.weight",
            "neck.fpn_res4_sum.bias",
            "neck.fpn_res5_sum.weight",
            "neck.fpn_res5_sum.bias",
        )
    ),
    replay=harness.Replay(tolerance=1e-5, steps_per_epoch=MAKE.STEPS_PER_EPOCH, arrays=same_gradients_twice),
    schedules=(harness.Schedule("lr_values", steps_per_epoch=MAKE.STEPS_PER_EPOCH, lr_at=MAKE.lr_steps),),
    parameter_tensors=88,
)
