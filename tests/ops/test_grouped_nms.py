"""grouped_nms: torchvision's NMS on every group at once; the float32 threshold of a float64 one."""

import numpy as np
import pytest
import torch
import torchvision

from ppdist.ops.nms import float32_threshold, grouped_nms


@pytest.mark.parametrize("threshold", [0.5, 0.6, 0.65, 0.7, 0.45])
def test_the_float32_threshold_splits_float32_ious_as_the_float64_one(threshold):
    below = np.float32(float32_threshold(threshold))
    assert float(below) <= threshold < float(np.nextafter(below, np.float32(np.inf)))


def test_groups_in_any_order_with_top_k_equal_torchvision_per_group():
    gen = torch.Generator().manual_seed(3)
    count = 3000
    groups = torch.randint(0, 7, (count,), generator=gen) * 3  # unsorted, ids with gaps, group 21 empty
    scores = torch.floor(torch.rand(count, generator=gen) * 20) / 20  # ties
    xy = torch.rand(count, 2, generator=gen) * 200
    boxes = torch.cat([xy, xy + torch.rand(count, 2, generator=gen) * 60 + 2], dim=1)
    for top_k in (-1, 150):
        kept = grouped_nms(boxes, scores, groups, 22, 0.55, top_k)
        want = torch.zeros(count, dtype=torch.bool)
        for group in groups.unique().tolist():
            (members,) = torch.nonzero(groups == group, as_tuple=True)
            order = torch.argsort(scores[members], descending=True, stable=True)
            members = members[order[:top_k] if top_k > -1 else order]
            want[members[torchvision.ops.nms(boxes[members], scores[members], 0.55)]] = True
        assert torch.equal(kept, want) and 0 < int(kept.sum()) < count


def test_nothing_to_suppress():
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 10.0]])
    scores = torch.tensor([0.9, 0.8])
    assert grouped_nms(boxes, scores, torch.tensor([0, 1]), 2, 0.5).tolist() == [True, True]
    assert grouped_nms(boxes, scores, torch.tensor([1, 1]), 2, 0.5).tolist() == [True, False]
    assert grouped_nms(boxes, scores, torch.tensor([1, 1]), 2, 0.5, top_k=0).tolist() == [False, False]
    assert grouped_nms(boxes[:0], scores[:0], torch.tensor([], dtype=torch.long), 2, 0.5).shape == (0,)


def test_empty_overlap_follows_paddle_for_touching_empty_boxes():
    """Two empty boxes that touch have IoU 0 / 0: torchvision keeps both, Paddle's NMS suppresses the
    second (``empty_overlap``); empty boxes apart, or an empty box inside a real one, suppress nothing."""
    boxes = torch.tensor(
        [
            [96.0, 30.0, 96.0, 64.0],  # empty (zero width)
            [96.0, 39.0, 96.0, 55.0],  # empty, touching the first
            [50.0, 10.0, 50.0, 20.0],  # empty, apart
            [40.0, 0.0, 60.0, 30.0],  # a real box around the third
        ]
    )
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    groups = torch.zeros(4, dtype=torch.long)
    assert grouped_nms(boxes, scores, groups, 1, 0.5).tolist() == [True, True, True, True]
    assert grouped_nms(boxes, scores, groups, 1, 0.5, empty_overlap=True).tolist() == [
        True,
        False,
        True,
        True,
    ]
