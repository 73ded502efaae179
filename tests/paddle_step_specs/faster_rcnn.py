"""A Faster R-CNN R50-vd FPN training step (the seed's recipe, PaddleDetection release/2.7.1's
configs/faster_rcnn/faster_rcnn_r50_vd_fpn_1x_coco.yml loaded unchanged, sampling made
deterministic with ``use_random: false``) is PaddleDetection's: the sampled RoIs and their box
logits, every loss term (RPN and RoI), gradients, the recipe's Momentum + L2 and its LR schedule
(PiecewiseDecay + LinearWarmup), against tests/fixtures/paddle_step/faster_rcnn.npz (written by
PaddleDetection's own model, targets, losses, optimizer builder and LR on paddlepaddle 2.6.2;
make_faster_rcnn.py). No Paddle is needed.

The model has 41.8 M parameters (res2 and the stem frozen, as ``freeze_at: 0``; BatchNorms
frozen, as ``freeze_norm``), so it is built in float64 to hold the sampled indices exactly and
trains in float32, as the fixture's. Measured (torch 2.14 CPU, float32): the 1,024 sampled RoIs
within 4.2e-8 relative and their labels exact, box logits 6.5e-7 and deltas 6.8e-7, every loss
term within 1.2e-7 (1.1e-7 on Paddle's own RPN maps and box outputs), sampled gradients worst
1.1e-5 (bbox_delta.weight; median 2.3e-7), 4 exactly-zero gradients in both (P4/P5's output
convolutions), Momentum + L2 replay at the warm-up LR within 5.1e-8 of the update (float64), the
LR equal at the 1,111 steps of lr_steps() (the warm-up and both decays).
"""

from __future__ import annotations

import os
from typing import Dict

import numpy as np
import paddle_step_harness as harness
import torch
from faster_rcnn_testing import R50_VD_FPN
from paddle_step_testing import load_arrays

from ppdist.convert.configs.convert import load_config

CONFIG = R50_VD_FPN
FIXTURE = os.path.join(harness.STEP_DIR, "faster_rcnn.npz")
TERMS = ("loss", "loss_rpn_cls", "loss_rpn_reg", "loss_bbox_cls", "loss_bbox_reg")
MAKE = harness.fixture_script("make_faster_rcnn.py")


DETERMINISTIC = [  # the fixture's one change: PaddleDetection's samplers take candidates in order
    "Architecture.Head.rpn_head.rpn_target_assign.use_random=false",
    "Architecture.Head.bbox_head.bbox_assigner.use_random=false",
    "Loss.rpn_target_assign.use_random=false",
]


def config(family: harness.Family) -> harness.Config:
    """The release config as ``tools/train.py -c`` reads it (converted, validated), with the
    fixture's one change: the samplers take candidates in order (``use_random: false``)."""
    config = load_config(CONFIG, DETERMINISTIC)
    head = config["Architecture"]["Head"]
    assert head["rpn_head"]["rpn_target_assign"]["use_random"] is False
    assert head["bbox_head"]["bbox_assigner"]["use_random"] is False
    return config


def targets() -> Dict[str, torch.Tensor]:
    gt_class, gt_bbox, pad = MAKE.ground_truth()
    return {
        "gt_class": torch.from_numpy(gt_class),
        "gt_bbox": torch.from_numpy(gt_bbox),
        "pad_gt_mask": torch.from_numpy(pad),
    }


def batch(family: harness.Family, variant: harness.Variant) -> harness.Batch:
    """The fixture's padded images, each image's size, and the ground truth (the box sampler reads
    it from the model's batch, the RPN targets from the loss's)."""
    image = torch.from_numpy(family.arrays["image"]).to(variant.dtype)
    inputs = {
        "image": image,
        "im_shape": torch.tensor(MAKE.IM_SHAPES),
        "scale_factor": torch.ones(2, 2),
        **targets(),
    }
    return inputs, targets()


def per_image(family: harness.Family, run: harness.StepRun, key: str) -> np.ndarray:
    """The fixture's concatenated per-RoI ``key`` rows in ppdist's padded [B, R, ...] layout."""
    mask = run.outputs["rois_mask"].numpy()
    rows = np.split(family.arrays[key], np.cumsum(family.arrays["rois_num"])[:-1])
    out = np.zeros(mask.shape + rows[0].shape[1:], dtype=rows[0].dtype)
    for image, part in enumerate(rows):
        assert int(mask[image].sum()) == len(part), (key, image)
        out[image][mask[image]] = part
    return out


def forward(family: harness.Family, run: harness.StepRun) -> harness.Comparison:
    """The sampled RoIs (in order), their labels exactly, box logits and deltas, every loss term."""
    labels = torch.where(run.outputs["rois_mask"], run.outputs["tgt_labels"], -1)
    theirs = per_image(family, run, "labels")
    assert np.array_equal(labels[run.outputs["rois_mask"]].numpy(), theirs[run.outputs["rois_mask"].numpy()])
    mask = run.outputs["rois_mask"]
    return harness.Comparison(
        arrays={
            "rois": (run.outputs["rois"][mask], per_image(family, run, "rois")[mask.numpy()]),
            "bbox_score": (
                run.outputs["bbox_score"][mask],
                per_image(family, run, "bbox_score")[mask.numpy()],
            ),
            "bbox_delta": (
                run.outputs["bbox_delta"][mask],
                per_image(family, run, "bbox_delta")[mask.numpy()],
            ),
        },
        values={term: (run.losses[term], family.arrays[f"loss/{term}"]) for term in TERMS},
    )


def paddle_rpn(family: harness.Family, key: str) -> torch.Tensor:
    """PaddleDetection's per-level RPN maps in ppdist's flat anchor order (location, then anchor)."""
    levels = sorted(k for k in family.arrays if k.startswith(f"{key}_"))
    flat = []
    for name in levels:
        value = torch.from_numpy(family.arrays[name])
        batch = value.shape[0]
        value = value.permute(0, 2, 3, 1)
        flat.append(value.reshape(batch, -1) if key == "rpn_score" else value.reshape(batch, -1, 4))
    return torch.cat(flat, dim=1)


def teacher(family: harness.Family, run: harness.StepRun) -> Dict[str, harness.Pair]:
    """Every loss term on PaddleDetection's RPN maps and box-head outputs (on the same RoIs)."""
    preds = {k: v.detach() if torch.is_tensor(v) else v for k, v in run.outputs.items()}
    preds["rpn_scores"] = paddle_rpn(family, "rpn_score")
    preds["rpn_deltas"] = paddle_rpn(family, "rpn_delta")
    preds["bbox_score"] = torch.from_numpy(per_image(family, run, "bbox_score"))
    preds["bbox_delta"] = torch.from_numpy(per_image(family, run, "bbox_delta"))
    ours = run.loss_fn(preds, targets())
    return {term: (ours[term].item(), family.arrays[f"loss/{term}"]) for term in TERMS}


def same_gradients_twice(arrays: harness.Arrays) -> harness.Arrays:
    """The fixture's replay fed its one step's gradients twice (``grad_1/`` as ``grad_2/``)."""
    again = {
        key.replace("grad_1/", "grad_2/"): value for key, value in arrays.items() if key.startswith("grad_1/")
    }
    again.update(
        {
            key.replace("grad_norm_1/", "grad_norm_2/"): v
            for key, v in arrays.items()
            if key.startswith("grad_norm_1/")
        }
    )
    return dict(arrays, **again)


TOLERANCE = harness.Tolerance(outputs=1e-4, loss=1e-4, gradients=1e-3, statistics=1e-4)

SPEC = harness.StepSpec(
    name="faster_rcnn",
    fixture=lambda: load_arrays(FIXTURE),
    paddle_state=MAKE.faster_rcnn_state,
    config=config,
    variants=(harness.Variant("float32", torch.float32, TOLERANCE),),
    base_dtype=torch.float64,  # 41.4 M trainable parameters: float32 cannot hold their indices
    batch=batch,
    forward=forward,
    teacher=teacher,
    teacher_tolerance=1e-5,
    statistics_variants=(),  # every BatchNorm is frozen (freeze_norm): no statistics to update
    # P4 and P5's output convolutions: at 160x192 every sampled anchor (the first ones, in order)
    # and every RoI lie on P2-P3, in both frameworks
    zero_gradients=harness.ZeroGradients(
        names=(
            "neck.fpn_res4_sum.weight",
            "neck.fpn_res4_sum.bias",
            "neck.fpn_res5_sum.weight",
            "neck.fpn_res5_sum.bias",
        )
    ),
    # Paddle's gradients through ppdist's Momentum + L2 at the recipe's warm-up LR (float64)
    replay=harness.Replay(tolerance=1e-5, steps_per_epoch=MAKE.STEPS_PER_EPOCH, arrays=same_gradients_twice),
    schedules=(harness.Schedule("lr_values", steps_per_epoch=MAKE.STEPS_PER_EPOCH, lr_at=MAKE.lr_steps),),
    parameter_tensors=72,
)
