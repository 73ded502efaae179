"""ATSS and task-aligned assigners: hand-made cases and a loop-based reference on a grid."""

import math
import statistics
from typing import List, Tuple

import pytest
import torch

from ppdist.losses.assigners import ATSSAssigner, TaskAlignedAssigner
from ppdist.ops.boxes import bbox2distance, box_centers, giou, pairwise_iou, points_inside_boxes


def grid_anchors(size: int, strides=(16, 8), cell: float = 5.0):
    """Grid-cell anchors as the PP-YOLOE head builds them (levels in the given order)."""
    boxes, points, counts, stride_list = [], [], [], []
    for s in strides:
        n = size // s
        ys, xs = torch.meshgrid((torch.arange(n) + 0.5) * s, (torch.arange(n) + 0.5) * s, indexing="ij")
        half = cell * s / 2
        boxes.append(torch.stack([xs - half, ys - half, xs + half, ys + half], -1).reshape(-1, 4))
        points.append(torch.stack([xs, ys], -1).reshape(-1, 2))
        counts.append(n * n)
        stride_list.append(torch.full((n * n, 1), float(s)))
    return torch.cat(boxes), torch.cat(points), counts, torch.cat(stride_list)


def one_image(boxes, labels):
    gt = torch.tensor([boxes], dtype=torch.float32)
    return torch.tensor([[[c] for c in labels]]), gt, torch.ones(1, len(boxes), 1)


# ---------------------------------------------------------------- box ops


def test_box_ops_hand_values():
    a = torch.tensor([[0.0, 0, 2, 2]])
    b = torch.tensor([[1.0, 1, 3, 3], [4, 4, 5, 5]])
    assert torch.allclose(pairwise_iou(a, b), torch.tensor([[1 / 7, 0.0]]))
    assert pairwise_iou(a[None], b[None]).shape == (1, 1, 2)
    assert math.isclose(giou(a[0], b[0]).item(), 1 / 7 - 2 / 9, rel_tol=1e-6)
    assert torch.equal(box_centers(b), torch.tensor([[2.0, 2], [4.5, 4.5]]))
    dist = bbox2distance(torch.tensor([[5.0, 5]]), torch.tensor([[0.0, 6, 30, 8]]), reg_max=16)
    assert torch.allclose(dist, torch.tensor([[5.0, 0.0, 15.99, 3.0]]))
    inside = points_inside_boxes(torch.tensor([[1.0, 1], [0, 1], [2, 2]]), a[None])
    assert inside.tolist() == [[[1.0, 0.0, 0.0]]]  # on the border is outside


# ---------------------------------------------------------------- ATSS


def test_atss_threshold_is_strictly_above_mean_plus_std():
    # four anchors symmetric around the gt: equal IoUs, std 0, threshold == IoU -> no positive
    anchors = torch.tensor([[-5.0, -5, 15, 15], [5, -5, 25, 15], [-5, 5, 15, 25], [5, 5, 25, 25]])
    labels, gt, pad = one_image([[0, 0, 20, 20]], [1])
    out_labels, _, scores = ATSSAssigner(topk=4, num_classes=3)(anchors, [4], labels, gt, pad, bg_index=3)
    assert out_labels.tolist() == [[3, 3, 3, 3]]
    assert scores.sum() == 0


def test_atss_positive_selection_and_soft_scores():
    anchors = torch.tensor([[0.0, 0, 20, 20], [5, 5, 25, 25], [20, 20, 40, 40], [-30, -30, -10, -10]])
    labels, gt, pad = one_image([[0, 0, 20, 20]], [2])
    ious = [1.0, 225 / 575, 0.0]  # the three nearest centres
    threshold = statistics.mean(ious) + statistics.stdev(ious)
    assert ious[1] < threshold < ious[0]
    pred = torch.tensor([[[0.0, 0, 20, 10], [0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]]])
    out_labels, out_boxes, scores = ATSSAssigner(topk=3, num_classes=3)(
        anchors, [4], labels, gt, pad, bg_index=3, pred_bboxes=pred
    )
    assert out_labels.tolist() == [[2, 3, 3, 3]]
    assert torch.equal(out_boxes[0, 0], gt[0, 0])
    assert torch.allclose(scores[0, 0], torch.tensor([0.0, 0.0, 0.5]))  # IoU(pred, gt) = 0.5
    assert scores[0, 1:].sum() == 0
    _, _, hard = ATSSAssigner(topk=3, num_classes=3)(anchors, [4], labels, gt, pad, bg_index=3)
    assert hard[0, 0].tolist() == [0.0, 0.0, 1.0]


def test_atss_candidate_must_have_its_point_inside_the_gt():
    # the best-IoU anchor has its centre on the gt border: not a positive
    anchors = torch.tensor([[0.0, 0, 40, 40], [100, 0, 140, 40], [-100, 0, -60, 40]])
    labels, gt, pad = one_image([[20, 0, 60, 40]], [0])
    out_labels, _, _ = ATSSAssigner(topk=3, num_classes=1)(anchors, [3], labels, gt, pad, bg_index=1)
    assert out_labels.tolist() == [[1, 1, 1]]


def test_atss_conflict_goes_to_highest_anchor_iou():
    anchors = torch.tensor([[5.0, 0, 45, 40], [100, 0, 140, 40], [-100, 0, -60, 40], [200, 200, 240, 240]])
    labels, gt, pad = one_image([[0, 0, 40, 40], [20, 0, 60, 40]], [0, 1])
    assigner = ATSSAssigner(topk=3, num_classes=2)
    # anchor 0 is a positive of both gts on its own
    for keep in (0, 1):
        solo = assigner(
            anchors, [4], labels[:, keep : keep + 1], gt[:, keep : keep + 1], pad[:, :1], bg_index=2
        )[0]
        assert solo[0, 0].item() == keep
    out_labels, out_boxes, _ = assigner(anchors, [4], labels, gt, pad, bg_index=2)
    assert out_labels.tolist() == [[0, 2, 2, 2]]  # IoU 0.778 with gt 0 beats 0.4545 with gt 1
    assert torch.equal(out_boxes[0, 0], gt[0, 0])


def test_atss_topk_is_per_level():
    # three levels of two anchors; per-level top-1 gives candidates 0, 2, 4 (IoUs 1, 0, 0):
    # threshold 1/3 + stdev = 0.91 < 1 -> anchor 0 positive. A global top-3 (0, 1, 2; IoUs
    # 1, 0.82, 0) would set the threshold above 1 and give no positive.
    anchors = torch.tensor(
        [
            [0.0, 0, 20, 20],
            [1, 1, 21, 21],
            [100, 100, 120, 120],
            [200, 200, 220, 220],
            [150, 150, 170, 170],
            [300, 300, 320, 320],
        ]
    )
    labels, gt, pad = one_image([[0, 0, 20, 20]], [0])
    out = ATSSAssigner(topk=1, num_classes=1)(anchors, [2, 2, 2], labels, gt, pad, bg_index=1)[0]
    assert out.tolist() == [[0, 1, 1, 1, 1, 1]]
    out = ATSSAssigner(topk=3, num_classes=1)(anchors, [6], labels, gt, pad, bg_index=1)[0]
    assert out.tolist() == [[1, 1, 1, 1, 1, 1]]


def reference_atss(anchors, counts, gts, topk) -> Tuple[List[Tuple[int, int]], int]:
    """Loop-based ATSS for one image: sorted (anchor, gt) positives and the number of conflicts."""
    centres = box_centers(anchors)
    claims = {}
    for g, box in enumerate(gts):
        ious = pairwise_iou(box[None], anchors, eps=1e-10)[0]
        dist = (centres - box_centers(box)).norm(dim=-1)
        cand, start = [], 0
        for n in counts:
            order = sorted(range(start, start + n), key=lambda i: (dist[i].item(), i))
            cand += order[:topk]
            start += n
        values = [ious[i].item() for i in cand]
        thr = statistics.mean(values) + statistics.stdev(values)
        for i in cand:
            x, y = centres[i].tolist()
            inside = min(x - box[0], y - box[1], box[2] - x, box[3] - y) > 1e-9
            if ious[i].item() > thr + 1e-6 and inside:
                claims.setdefault(i, []).append(g)
    all_ious = pairwise_iou(gts, anchors, eps=1e-10)
    pairs = sorted((i, gs[0] if len(gs) == 1 else int(all_ious[:, i].argmax())) for i, gs in claims.items())
    return pairs, sum(len(gs) > 1 for gs in claims.values())


def test_atss_matches_loop_reference_on_a_grid():
    anchors, _, counts, _ = grid_anchors(128, strides=(32, 16, 8))
    gts = torch.tensor([[3.0, 5, 60, 81], [40, 36, 120, 100], [66, 4, 94, 24], [50, 40, 110, 100]])
    labels = torch.tensor([[[4], [1], [2], [3]]])
    out_labels, out_boxes, _ = ATSSAssigner(topk=9, num_classes=5)(
        anchors, counts, labels, gts[None], torch.ones(1, 4, 1), bg_index=5
    )
    got = [(i, int(out_labels[0, i])) for i in range(len(anchors)) if out_labels[0, i] != 5]
    pairs, conflicts = reference_atss(anchors, counts, gts, topk=9)
    assert got == [(i, [4, 1, 2, 3][g]) for i, g in pairs]
    assert conflicts > 0 and {label for _, label in got} == {1, 2, 4}  # gt 3 loses its anchors to gt 1


def test_atss_padding_and_empty_batches_are_background():
    anchors, _, counts, _ = grid_anchors(128, strides=(32, 16, 8))
    assigner = ATSSAssigner(topk=9, num_classes=4)
    labels = torch.tensor([[[1], [0]], [[0], [0]]])
    gt = torch.tensor([[[40.0, 36, 120, 100], [0, 0, 0, 0]], [[0.0, 0, 0, 0], [0, 0, 0, 0]]])
    pad = torch.tensor([[[1.0], [0.0]], [[0.0], [0.0]]])
    out_labels, _, scores = assigner(anchors, counts, labels, gt, pad, bg_index=4)
    assert (out_labels[0] != 4).any() and (out_labels[1] == 4).all()
    assert scores[1].sum() == 0
    empty = assigner(
        anchors,
        counts,
        torch.zeros(2, 0, 1, dtype=torch.long),
        torch.zeros(2, 0, 4),
        torch.zeros(2, 0, 1),
        bg_index=4,
    )
    assert empty[0].shape == (2, len(anchors)) and (empty[0] == 4).all()
    assert empty[1].shape == (2, len(anchors), 4) and empty[2].shape == (2, len(anchors), 4)
    assert empty[2].sum() == 0


# ---------------------------------------------------------------- TAL


def test_tal_conflict_goes_to_highest_predicted_iou_and_soft_score():
    points = torch.tensor([[10.0, 10], [30, 10], [50, 10]])
    labels, gt, pad = one_image([[0, 0, 40, 20], [20, 0, 60, 20]], [0, 2])
    pred_boxes = torch.tensor([[[100.0, 100, 110, 110], [20, 0, 50, 20], [100, 100, 110, 110]]])
    pred_scores = torch.full((1, 3, 3), 0.5)
    out_labels, out_boxes, scores = TaskAlignedAssigner(topk=1, num_classes=3)(
        pred_scores, pred_boxes, points, [3], labels, gt, pad, bg_index=3
    )
    # point 1 is the top-1 of both gts; IoU(pred, gt1) = 0.75 > IoU(pred, gt0) = 0.4
    assert out_labels.tolist() == [[3, 2, 3]]
    assert torch.equal(out_boxes[0, 1], gt[0, 1])
    assert torch.allclose(scores[0, 1], torch.tensor([0.0, 0.0, 0.75]), atol=1e-6)
    assert scores[0, [0, 2]].sum() == 0


def test_tal_normalised_alignment_metric():
    points = torch.tensor([[10.0, 10], [30, 10], [50, 10], [70, 10]])
    labels, gt, pad = one_image([[0, 0, 60, 20]], [1])
    pred_boxes = torch.tensor([[[0.0, 0, 60, 20], [0, 0, 30, 20], [0, 0, 60, 10], [60, 0, 80, 20]]])
    pred_scores = torch.tensor([[[0.1, 0.2], [0.3, 0.8], [0.0, 0.4], [0.0, 0.9]]])
    alpha, beta = 1.0, 2.0
    out_labels, _, scores = TaskAlignedAssigner(topk=2, alpha=alpha, beta=beta, num_classes=2)(
        pred_scores, pred_boxes, points, [4], labels, gt, pad, bg_index=2
    )
    # metrics: 0.2*1, 0.8*0.25, 0.4*0.25 -> top-2 = points 0 and 1 (0.2 each); point 3 is outside
    assert out_labels.tolist() == [[1, 1, 2, 2]]
    t = [0.2 * 1.0**beta, 0.8 * 0.5**beta]
    max_iou = 1.0
    expected = [t[0] / max(t) * max_iou, t[1] / max(t) * max_iou]
    assert torch.allclose(scores[0, :2, 1], torch.tensor(expected), atol=1e-6)
    assert scores[0, :, 0].sum() == 0 and scores[0, 2:].sum() == 0


def test_tal_respects_padding_and_empty_batches():
    anchors, points, counts, _ = grid_anchors(32)
    num = len(points)
    assigner = TaskAlignedAssigner(topk=13, num_classes=4)
    pred_boxes = torch.cat([points - 6, points + 6], -1).expand(2, -1, -1)
    pred_scores = torch.full((2, num, 4), 0.3)
    labels = torch.tensor([[[3], [0]], [[0], [0]]])
    gt = torch.tensor([[[2.0, 2, 30, 30], [0, 0, 0, 0]], [[4.0, 4, 20, 20], [0, 0, 0, 0]]])
    pad = torch.tensor([[[1.0], [0.0]], [[0.0], [0.0]]])
    out_labels, _, scores = assigner(pred_scores, pred_boxes, points, counts, labels, gt, pad, bg_index=4)
    assert (out_labels[0] == 3).sum() == 13 and (out_labels[1] == 4).all()
    assert scores[1].sum() == 0 and scores[0, :, :3].sum() == 0
    empty = assigner(
        pred_scores,
        pred_boxes,
        points,
        counts,
        torch.zeros(2, 0, 1, dtype=torch.long),
        torch.zeros(2, 0, 4),
        torch.zeros(2, 0, 1),
        bg_index=4,
    )
    assert (empty[0] == 4).all() and empty[2].shape == (2, num, 4) and empty[2].sum() == 0


def test_assigners_reject_bad_shapes():
    with pytest.raises(ValueError, match="gt_labels"):
        ATSSAssigner()(torch.zeros(4, 4), [4], torch.zeros(1, 2), torch.zeros(1, 2, 4), torch.ones(1, 2, 1))
    with pytest.raises(ValueError, match="classes"):
        TaskAlignedAssigner(num_classes=80)(
            torch.zeros(1, 4, 3),
            torch.zeros(1, 4, 4),
            torch.zeros(4, 2),
            [4],
            torch.zeros(1, 1, 1),
            torch.zeros(1, 1, 4),
            torch.ones(1, 1, 1),
        )
