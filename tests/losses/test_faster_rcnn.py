"""ppdist.losses.faster_rcnn against PaddleDetection's RPNHead.get_loss / BBoxHead.get_loss
(tests/fixtures/faster_rcnn/make_targets.py), the registered FasterRCNNLoss and the
no-host-read rule."""

from __future__ import annotations

import pytest
import torch
from faster_rcnn_testing import tiny_faster_rcnn
from rcnn_targets_testing import load_targets_fixture, roi_targets, rpn_targets

import ppdist.components  # noqa: F401  (registers the model parts)
from ppdist.errors import DataError
from ppdist.losses.faster_rcnn import FasterRCNNLoss, bbox_head_loss, rpn_loss
from ppdist.modeling.architectures import BaseModel
from ppdist.registry import LOSSES
from ppdist.utils.host_sync import HostSyncCounter


@pytest.fixture(scope="module")
def fx():
    return load_targets_fixture()


def _targets(fx):
    return rpn_targets(fx), roi_targets(fx)


def test_rpn_loss_equals_paddle(fx):
    rpn, _ = _targets(fx)
    out = rpn_loss(fx["rpn_scores"], fx["rpn_deltas"], rpn)
    torch.testing.assert_close(out["loss_rpn_cls"], fx["loss_rpn_cls"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["loss_rpn_reg"], fx["loss_rpn_reg"], atol=1e-5, rtol=1e-5)


def test_bbox_head_loss_equals_paddle(fx):
    _, roi = _targets(fx)
    out = bbox_head_loss(fx["bbox_score"], fx["bbox_delta"], roi, 4)
    torch.testing.assert_close(out["loss_bbox_cls"], fx["loss_bbox_cls"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["loss_bbox_reg"], fx["loss_bbox_reg"], atol=1e-5, rtol=1e-5)


def test_registered_loss_sums_terms_and_backpropagates(fx):
    _, roi = _targets(fx)
    loss = LOSSES.build(
        {
            "name": "FasterRCNNLoss",
            "num_classes": 4,
            "rpn_target_assign": {"batch_size_per_im": 64, "use_random": False},
        }
    )
    assert isinstance(loss, FasterRCNNLoss)
    scores = fx["rpn_scores"].clone().requires_grad_(True)
    bbox_score = fx["bbox_score"].clone().requires_grad_(True)
    preds = {
        "rpn_scores": scores,
        "rpn_deltas": fx["rpn_deltas"],
        "anchors": fx["anchors"],
        "bbox_score": bbox_score,
        "bbox_delta": fx["bbox_delta"],
        **roi,
    }
    batch = {
        "gt_bbox": fx["gt_bbox"],
        "gt_class": fx["gt_class"],
        "pad_gt_mask": fx["gt_mask"],
        "is_crowd": fx["is_crowd"],
    }
    out = loss(preds, batch)
    total = sum(float(fx[k]) for k in ("loss_rpn_cls", "loss_rpn_reg", "loss_bbox_cls", "loss_bbox_reg"))
    assert abs(out["loss"].item() - total) < 1e-4
    out["loss"].backward()
    # unsampled anchors and empty slots get no gradient
    assert scores.grad[0].ne(0).sum().item() == 64
    with HostSyncCounter() as counter:
        loss(preds, batch)["loss"].backward()
    assert counter.count == 0, counter.report()
    with pytest.raises(DataError, match="gt_bbox"):
        loss(preds, {"gt_class": fx["gt_class"]})


def test_training_step_through_faster_rcnn_head():
    """FasterRCNNHead (training) -> BBoxAssigner -> FasterRCNNLoss: finite terms, gradients into the
    backbone, and no host read but the proposal NMS's in the whole step (ops/nms.grouped_nms)."""
    torch.manual_seed(0)
    model = BaseModel(tiny_faster_rcnn()).train()
    loss = LOSSES.build({"name": "FasterRCNNLoss"})
    z = [0.0, 0.0, 0.0, 0.0]
    batch = {
        "image": torch.randn(2, 3, 64, 96),
        "im_shape": torch.tensor([[64.0, 96.0], [60.0, 90.0]]),
        "gt_bbox": torch.tensor([[[4.0, 6, 40, 50], [50, 10, 90, 60], z], [[10.0, 10, 30, 30], z, z]]),
        "gt_class": torch.tensor([[[1], [2], [0]], [[0], [0], [0]]]),
        "pad_gt_mask": torch.tensor([[[1.0], [1], [0]], [[1.0], [0], [0]]]),
        "is_crowd": torch.zeros(2, 3, 1, dtype=torch.int32),
    }
    with HostSyncCounter() as counter:
        out = loss(model(batch), batch)
        out["loss"].backward()
    assert "losses/" not in counter.report()
    # the only host reads of the whole step: the proposal NMS's (ops/nms.grouped_nms: its kept counts)
    assert counter.count > 0 and all(key.endswith("(grouped_nms)") for key in counter.summary()), (
        counter.report()
    )
    assert set(out) == {"loss", "loss_rpn_cls", "loss_rpn_reg", "loss_bbox_cls", "loss_bbox_reg"}
    assert all(torch.isfinite(v) for v in out.values())
    assert out["loss_bbox_reg"] > 0 and out["loss_rpn_reg"] > 0  # the gt boxes are appended: fg RoIs exist
    assert model.backbone.res5.res5a.branch2a.conv.weight.grad.abs().sum() > 0


def test_unused_nan_targets_leave_values_and_gradients_finite(fx):
    rpn, roi = _targets(fx)
    rpn = dict(rpn, deltas=torch.where(rpn["labels"].unsqueeze(-1) == 1, rpn["deltas"], float("nan")))
    bg = (roi["tgt_labels"] == 4) | (roi["tgt_labels"] < 0)
    roi = dict(roi, rois=torch.where(bg.unsqueeze(-1), 0.0, roi["rois"]))  # empty boxes: 0 / 0 deltas
    deltas = fx["rpn_deltas"].clone().requires_grad_(True)
    bbox_delta = fx["bbox_delta"].clone().requires_grad_(True)
    out = rpn_loss(fx["rpn_scores"], deltas, rpn)
    out.update(bbox_head_loss(fx["bbox_score"], bbox_delta, roi, 4))
    torch.testing.assert_close(out["loss_rpn_reg"], fx["loss_rpn_reg"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["loss_bbox_reg"], fx["loss_bbox_reg"], atol=1e-5, rtol=1e-5)
    (out["loss_rpn_reg"] + out["loss_bbox_reg"]).backward()
    assert torch.isfinite(deltas.grad).all() and torch.isfinite(bbox_delta.grad).all()
