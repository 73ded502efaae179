"""PPYOLOELoss: VFL / focal / GIoU / DFL against hand values, the full forward and backward,
the ATSS -> TAL switch, normalisation and config validation."""

import math
from typing import Dict

import pytest
import torch
import torch.nn.functional as F

from ppdist.errors import ConfigError
from ppdist.losses import PPYOLOELoss
from ppdist.losses.ppyoloe import distribution_focal_loss, giou_loss, sigmoid_focal_loss, varifocal_loss
from ppdist.ops.boxes import bbox2distance, distance2bbox
from ppdist.registry import LOSSES

REG_MAX = 16


def make_preds(
    size: int = 128,
    num_classes: int = 6,
    batch: int = 2,
    strides=(32, 16, 8),
    seed: int = 0,
    requires_grad: bool = True,
) -> Dict[str, object]:
    """Random head outputs plus grid-cell anchors, as the PP-YOLOE head returns them in training."""
    boxes, points, counts, stride_list = [], [], [], []
    for s in strides:
        n = size // s
        ys, xs = torch.meshgrid((torch.arange(n) + 0.5) * s, (torch.arange(n) + 0.5) * s, indexing="ij")
        boxes.append(torch.stack([xs - 2.5 * s, ys - 2.5 * s, xs + 2.5 * s, ys + 2.5 * s], -1).reshape(-1, 4))
        points.append(torch.stack([xs, ys], -1).reshape(-1, 2))
        counts.append(n * n)
        stride_list.append(torch.full((n * n, 1), float(s)))
    gen = torch.Generator().manual_seed(seed)
    num = sum(counts)
    cls = (torch.randn(batch, num, num_classes, generator=gen) - 3.0).requires_grad_(requires_grad)
    reg = torch.randn(batch, num, 4 * (REG_MAX + 1), generator=gen).requires_grad_(requires_grad)
    return {
        "cls_logits": cls,
        "reg_distri": reg,
        "anchors": torch.cat(boxes),
        "anchor_points": torch.cat(points),
        "num_anchors_list": counts,
        "stride_tensor": torch.cat(stride_list),
    }


def make_batch(epoch_id=0) -> Dict[str, object]:
    """Two images: three real boxes plus one padded slot, and none at all."""
    gt_bbox = torch.tensor(
        [[[3.0, 5, 60, 81], [40, 36, 120, 100], [66, 4, 94, 24], [0, 0, 0, 0]], [[0.0, 0, 0, 0]] * 4]
    )
    gt_class = torch.tensor([[[4], [1], [2], [0]], [[0]] * 4])
    pad = torch.tensor([[[1.0], [1.0], [1.0], [0.0]], [[0.0]] * 4])
    return {"gt_class": gt_class, "gt_bbox": gt_bbox, "pad_gt_mask": pad, "epoch_id": epoch_id}


# ---------------------------------------------------------------- loss terms


def bce(p: float, q: float) -> float:
    return -(q * math.log(p) + (1 - q) * math.log(1 - p))


def test_varifocal_loss_hand_value_and_undetached_weight():
    logits = torch.tensor([[[0.0, 1.0, -2.0]]], requires_grad=True)
    q = torch.tensor([[[0.6, 0.0, 0.0]]])
    one_hot = torch.tensor([[[1.0, 0.0, 0.0]]])
    p = [0.5, 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(2))]
    expected = 0.6 * bce(p[0], 0.6) + 0.75 * p[1] ** 2 * bce(p[1], 0) + 0.75 * p[2] ** 2 * bce(p[2], 0)
    loss = varifocal_loss(logits, q, one_hot)
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)
    loss.backward()
    # the gradient is that of the probability-space formula with the weight not detached
    ref_logits = logits.detach().clone().requires_grad_(True)
    prob = ref_logits.sigmoid()
    weight = 0.75 * prob.pow(2) * (1 - one_hot) + q * one_hot
    (F.binary_cross_entropy(prob, q, reduction="none") * weight).sum().backward()
    assert torch.allclose(logits.grad, ref_logits.grad, atol=1e-6)
    detached_logits = logits.detach().clone().requires_grad_(True)
    (
        F.binary_cross_entropy_with_logits(detached_logits, q, reduction="none") * weight.detach()
    ).sum().backward()
    assert not torch.allclose(logits.grad, detached_logits.grad, atol=1e-3)


def test_sigmoid_focal_loss_hand_value():
    logits = torch.tensor([0.0, 2.0])
    q = torch.tensor([0.8, 0.0])
    p1 = 1 / (1 + math.exp(-2))
    with_alpha = 0.3**2 * (0.25 * 0.8 + 0.75 * 0.2) * bce(0.5, 0.8) + p1**2 * 0.75 * bce(p1, 0.0)
    assert math.isclose(sigmoid_focal_loss(logits, q).item(), with_alpha, rel_tol=1e-6)
    no_alpha = 0.3**2 * bce(0.5, 0.8) + p1**2 * bce(p1, 0.0)
    assert math.isclose(sigmoid_focal_loss(logits, q, alpha=-1).item(), no_alpha, rel_tol=1e-6)


def test_giou_loss_hand_values():
    pred = torch.tensor([[0.0, 0, 2, 2], [0, 0, 2, 2], [0, 0, 1, 1]])
    target = torch.tensor([[1.0, 1, 3, 3], [0, 0, 2, 2], [2, 0, 3, 1]])
    expected = torch.tensor([1 - (1 / 7 - 2 / 9), 0.0, 1 - (0 - 1 / 3)])
    assert torch.allclose(giou_loss(pred, target), expected, atol=1e-6)


def test_distribution_focal_loss_hand_value():
    logits = torch.zeros(1, 4, REG_MAX + 1)
    logits[0, 0, 2], logits[0, 0, 3] = 2.0, 1.0
    target = torch.tensor([[2.3, 0.0, 15.99, 7.0]])
    log_z = math.log(math.exp(2) + math.exp(1) + 15)
    side0 = 0.7 * (log_z - 2) + 0.3 * (log_z - 1)
    uniform = math.log(REG_MAX + 1)  # any split of the remaining sides costs log(17)
    expected = (side0 + 3 * uniform) / 4
    assert math.isclose(distribution_focal_loss(logits, target).item(), expected, rel_tol=1e-5)


def test_dfl_targets_are_clipped_below_reg_max():
    dist = bbox2distance(torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, -30, 30, 1.5]]), REG_MAX)
    assert torch.allclose(dist, torch.tensor([[0.0, 15.99, 15.99, 0.5]]))


# ---------------------------------------------------------------- full loss


def run(loss: PPYOLOELoss, preds, batch) -> Dict[str, torch.Tensor]:
    out = loss(preds, batch)
    assert set(out) == {"loss", "loss_cls", "loss_iou", "loss_dfl", "loss_l1", "normalizer"}
    return out


def test_forward_backward_with_padding_and_an_empty_image():
    loss = PPYOLOELoss(num_classes=6, static_assigner_epoch=2)
    for epoch in (0, 2):
        preds = make_preds()
        out = run(loss, preds, make_batch(epoch))
        for value in out.values():
            assert value.ndim == 0 and torch.isfinite(value)
        assert out["loss_iou"] > 0 and out["loss_dfl"] > 0 and out["loss_l1"] > 0
        expected = 1.0 * out["loss_cls"] + 2.5 * out["loss_iou"] + 0.5 * out["loss_dfl"]
        assert torch.allclose(out["loss"], expected)  # L1 is logged only
        out["loss"].backward()
        for key in ("cls_logits", "reg_distri"):
            grad = preds[key].grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
        # the image without boxes still gets a classification gradient (all background)
        assert preds["cls_logits"].grad[1].abs().sum() > 0


def test_loss_matches_its_parts():
    """Rebuild the loss from the public pieces: decoding, stride scaling and normalisation."""
    loss = PPYOLOELoss(num_classes=6, static_assigner_epoch=1)
    preds, batch = make_preds(seed=3), make_batch(epoch_id=5)
    out = run(loss, preds, batch)
    stride = preds["stride_tensor"]
    dist = preds["reg_distri"].detach().reshape(2, -1, 4, REG_MAX + 1)
    points_s = preds["anchor_points"] / stride
    boxes_s = distance2bbox(points_s, dist.softmax(-1) @ torch.arange(REG_MAX + 1.0))
    cls = preds["cls_logits"].detach()
    labels, gt_boxes, scores = loss.assigner(
        cls.sigmoid(),
        boxes_s * stride,
        preds["anchor_points"],
        preds["num_anchors_list"],
        batch["gt_class"],
        batch["gt_bbox"],
        batch["pad_gt_mask"],
        bg_index=6,
    )
    norm = scores.sum().clamp(min=1)
    pos = labels != 6
    gt_s = gt_boxes / stride
    weight = scores.sum(-1)[pos]
    assert pos.sum() > 0
    one_hot = F.one_hot(labels, 7)[..., :6].float()
    assert torch.allclose(out["loss_cls"], varifocal_loss(cls, scores, one_hot) / norm, rtol=1e-5)
    assert torch.allclose(
        out["loss_iou"], (giou_loss(boxes_s[pos], gt_s[pos]) * weight).sum() / norm, rtol=1e-5
    )
    target = bbox2distance(points_s.expand(2, -1, -1), gt_s, REG_MAX)[pos]
    dfl = (distribution_focal_loss(dist[pos], target) * weight).sum() / norm
    assert torch.allclose(out["loss_dfl"], dfl, rtol=1e-5)
    assert torch.allclose(out["loss_l1"], (boxes_s[pos] - gt_s[pos]).abs().mean(), rtol=1e-5)


class Spy:
    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


@pytest.mark.parametrize(
    "epoch_id,expect_static",
    [(0, True), (2, True), (torch.tensor(2), True), (3, False), (torch.tensor(7), False)],
)
def test_atss_then_tal_by_epoch_id(epoch_id, expect_static):
    loss = PPYOLOELoss(num_classes=6, static_assigner_epoch=3)
    loss.static_assigner, loss.assigner = Spy(loss.static_assigner), Spy(loss.assigner)
    run(loss, make_preds(requires_grad=False), make_batch(epoch_id))
    assert (loss.static_assigner.calls, loss.assigner.calls) == ((1, 0) if expect_static else (0, 1))


@pytest.mark.parametrize("epoch_id", [0, 10])
def test_batch_without_boxes(epoch_id):
    loss = PPYOLOELoss(num_classes=6, static_assigner_epoch=5)
    preds = make_preds()
    batch = {
        "gt_class": torch.zeros(2, 0, 1, dtype=torch.long),
        "gt_bbox": torch.zeros(2, 0, 4),
        "pad_gt_mask": torch.zeros(2, 0, 1),
        "epoch_id": epoch_id,
    }
    out = run(loss, preds, batch)
    assert out["loss_iou"] == 0 and out["loss_dfl"] == 0 and out["loss_l1"] == 0
    # S = 0 is clamped to 1: the class loss is the plain sum of 0.75 p^2 BCE(p, 0)
    p = preds["cls_logits"].detach().sigmoid()
    assert torch.allclose(out["loss_cls"], (0.75 * p**2 * -torch.log1p(-p)).sum(), rtol=1e-5)
    out["loss"].backward()
    assert preds["reg_distri"].grad is not None  # box losses stay connected to the graph
    assert torch.isfinite(preds["cls_logits"].grad).all()


def test_focal_loss_variant_and_custom_weights():
    loss = PPYOLOELoss(
        num_classes=6, use_varifocal_loss=False, loss_weight={"class": 2.0, "iou": 1.0, "dfl": 0.0}
    )
    out = run(loss, make_preds(), make_batch())
    assert torch.allclose(out["loss"], 2.0 * out["loss_cls"] + out["loss_iou"])
    out["loss"].backward()


def test_normaliser_is_all_reduced(monkeypatch):
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(
        dist, "all_reduce", lambda t, op=None: (calls.append(op), t.mul_(4.0))
    )  # 4 equal ranks
    loss = PPYOLOELoss(num_classes=6)
    preds, batch = make_preds(requires_grad=False), make_batch()
    reduced = loss(preds, batch)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    local = loss(preds, batch)
    assert calls == [dist.ReduceOp.SUM]
    for key in ("loss_cls", "loss_iou", "loss_dfl"):
        assert torch.allclose(reduced[key], local[key])


def test_built_from_config_and_validation():
    loss = LOSSES.build(
        {
            "name": "PPYOLOELoss",
            "num_classes": 6,
            "static_assigner_epoch": 30,
            "static_assigner": {"name": "ATSSAssigner", "topk": 9},
            "assigner": {"name": "TaskAlignedAssigner", "topk": 13, "alpha": 1.0, "beta": 6.0},
        }
    )
    assert loss.assigner.topk == 13 and loss.static_assigner.topk == 9 and loss.static_assigner_epoch == 30
    with pytest.raises(ValueError, match="must be named 'ATSSAssigner'"):
        PPYOLOELoss(static_assigner={"name": "TaskAlignedAssigner"})
    with pytest.raises(ValueError, match=r"unknown keys \['gamma'\]"):
        PPYOLOELoss(assigner={"name": "TaskAlignedAssigner", "gamma": 1.0})
    with pytest.raises(ValueError, match="topk"):
        PPYOLOELoss(assigner={"name": "TaskAlignedAssigner", "topk": 0})
    with pytest.raises(ValueError, match="loss_weight"):
        PPYOLOELoss(loss_weight={"cls": 1.0})
    with pytest.raises(ConfigError, match="ATSSAssigner"):
        LOSSES.build({"name": "PPYOLOELoss", "static_assigner": {"name": "ATSS"}})
    with pytest.raises(ValueError, match="classes"):
        PPYOLOELoss(num_classes=80)(make_preds(requires_grad=False), make_batch())
