"""Cascade R-CNN's CascadeHead and its later stages' targets (the whole model against
PaddleDetection: tests/engine/test_paddle_step.py's ``cascade_rcnn`` spec and
tests/modeling/test_cascade_rcnn_eval.py)."""

from __future__ import annotations

import pytest
import torch
from faster_rcnn_testing import tiny_cascade_rcnn

import ppdist.components  # noqa: F401  (registers every component)
from ppdist.losses.rcnn_targets import cascade_assign, pairwise_iou
from ppdist.modeling.architectures import BaseModel
from ppdist.registry import HEADS, LOSSES
from ppdist.utils.host_sync import HostSyncCounter


def batch_of(images: torch.Tensor) -> dict:
    return {
        "image": images,
        "im_shape": torch.tensor([[96.0, 128.0], [80.0, 112.0]]),
        "gt_bbox": torch.tensor(
            [[[8.0, 10.0, 60.0, 70.0], [50.0, 20.0, 120.0, 90.0]], [[5.0, 5.0, 40.0, 50.0], [0, 0, 0, 0]]]
        ),
        "gt_class": torch.tensor([[[0], [2]], [[1], [0]]]),
        "pad_gt_mask": torch.tensor([[[1.0], [1.0]], [[1.0], [0.0]]]),
    }


def test_cascade_assign_labels_every_valid_box_at_the_threshold():
    """No sampling, no ground truth appended: each masked-in box is foreground at IoU >= the
    threshold (its best gt's class), background below it (class = num_classes); masked-out slots
    and boxes ignored next to a crowd box get -1."""
    torch.manual_seed(0)
    xy = torch.rand(2, 40, 2) * 80
    rois = torch.cat([xy, xy + 10 + torch.rand(2, 40, 2) * 50], dim=-1)
    batch = batch_of(torch.zeros(2, 3, 96, 128))
    gt, valid = batch["gt_bbox"], batch["pad_gt_mask"][..., 0] > 0
    rois[0, :2] = gt[0]  # two exact matches
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 30:] = False
    out = cascade_assign(rois, mask, gt, batch["gt_class"], valid, 3, 0.6)
    iou = torch.where(valid[:, :, None], pairwise_iou(gt, rois), -1.0)
    best, match = iou.max(1)
    expected = torch.where(best >= 0.6, batch["gt_class"][..., 0].gather(1, match), 3)
    expected = torch.where(mask, expected, -1)
    assert torch.equal(out["tgt_labels"], expected)
    assert out["tgt_labels"][0, :2].tolist() == [0, 2] and (out["tgt_labels"][1, 30:] == -1).all()
    assert torch.equal(out["rois"], rois) and torch.equal(out["rois_mask"], mask)
    assert torch.equal(out["tgt_bboxes"], gt.gather(1, match[..., None].expand(-1, -1, 4)))


def test_later_stages_refine_clip_and_label_the_boxes_without_host_reads():
    torch.manual_seed(1)
    model = BaseModel(tiny_cascade_rcnn()).train()
    batch = batch_of(torch.randn(2, 3, 96, 128))
    with HostSyncCounter() as counter:
        out = model(batch)
    stages = [key for key in out if key.startswith("bbox_score_stage")]
    assert stages == ["bbox_score_stage0", "bbox_score_stage1", "bbox_score_stage2"]
    for stage in (1, 2):
        rois, mask = out[f"rois_stage{stage}"], out[f"rois_mask_stage{stage}"]
        h, w = batch["im_shape"][:, 0, None], batch["im_shape"][:, 1, None]
        assert (rois[..., 0] >= 0).all() and (rois[..., 2] <= w).all() and (rois[..., 3] <= h).all()
        nonempty = (rois[..., 2] > rois[..., 0]) & (rois[..., 3] > rois[..., 1])
        assert not (mask & ~nonempty).any() and not (mask & ~out["rois_mask_stage0"]).any()
        labels = out[f"tgt_labels_stage{stage}"]
        assert ((labels >= 0) == mask).all() and not rois.requires_grad
    # only the RPN's proposal NMS reads the host (its group sizes and suppression rounds)
    assert all(key.endswith("(grouped_nms)") for key in counter.summary()), counter.report()
    loss = LOSSES.build({"name": "CascadeRCNNLoss"})(out, batch)
    names = [k for k in loss if k.startswith("loss_bbox")]
    assert len(names) == 6 and torch.isclose(loss["loss"], sum(v for k, v in loss.items() if k != "loss"))
    loss["loss"].backward()
    for stage in range(3):
        assert model.head.bbox_head.head._modules[str(stage)].fc6.weight.grad.abs().sum() > 0


def test_eval_scores_are_the_stages_mean_and_the_boxes_the_last_stages():
    torch.manual_seed(2)
    model = BaseModel(tiny_cascade_rcnn()).eval()
    with torch.no_grad():
        out = model(batch_of(torch.randn(2, 3, 96, 128)))
    mean = sum(torch.softmax(out[f"bbox_score_stage{s}"], -1) for s in range(3)) / 3
    assert torch.allclose(out["bbox_prob"], mean, atol=1e-6)
    assert torch.equal(out["bbox_delta"], out["bbox_delta_stage2"]) and out["bbox_delta"].shape[-1] == 4
    assert torch.equal(out["rois"], out["rois_stage2"])
    assert torch.equal(out["rois_mask"], out["rpn_rois_mask"])  # eval masks nothing more


def test_class_specific_deltas_refine_with_the_predicted_class():
    head = HEADS.build(
        {
            "name": "CascadeHead",
            "head": {"name": "CascadeTwoFCHead", "out_channel": 16},
            "num_classes": 3,
            "reg_class_agnostic": False,
            "feat_channel": 8,
            "feat_strides": [4, 8, 16, 32],
        }
    ).eval()
    feats = [torch.randn(1, 8, 24 // 2**i, 32 // 2**i) for i in range(4)]
    rois = torch.tensor([[[4.0, 4.0, 40.0, 50.0], [10.0, 20.0, 90.0, 80.0]]])
    with torch.no_grad():
        out = head(feats, rois, torch.ones(1, 2, dtype=torch.bool), im_shape=torch.tensor([[96.0, 128.0]]))
    assert out["bbox_delta_stage0"].shape[-1] == 4 and out["bbox_delta_stage2"].shape[-1] == 12


def test_a_head_without_im_shape_or_resample_is_one_line():
    head = HEADS.build(
        {"name": "CascadeHead", "head": {"name": "CascadeTwoFCHead", "out_channel": 16}, "feat_channel": 8}
    )
    feats = [torch.randn(1, 8, 24 // 2**i, 32 // 2**i) for i in range(4)]
    rois, mask = torch.tensor([[[4.0, 4.0, 40.0, 50.0]]]), torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="needs each image's im_shape"):
        head(feats, rois, mask)
    with pytest.raises(ValueError, match="training needs the sampler's cascade_stage"):
        head.train()(feats, rois, mask, im_shape=torch.tensor([[96.0, 128.0]]))
    assigner = HEADS.build({"name": "BBoxAssigner", "num_classes": 3})
    with pytest.raises(ValueError, match="cascade stage 3 has no cascade_iou"):
        assigner.cascade_stage(rois, mask, batch_of(torch.zeros(1, 3, 8, 8)), 3)
