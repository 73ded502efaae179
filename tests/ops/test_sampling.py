"""ops.sampling: PaddleDetection's label_box / subsample_labels rules in fixed shapes."""

import torch

from ppdist.ops.box_coder import bbox2delta, delta2bbox
from ppdist.ops.sampling import compact, match_boxes, sample_labels

BOXES = torch.tensor([[[0, 0, 10, 10], [0, 0, 9, 10], [20, 20, 30, 30], [50, 50, 60, 60], [0, 0, 0, 0.0]]])
GT = torch.tensor([[[0, 0, 10, 10], [21, 21, 31, 31], [0, 0, 0, 0.0]]])


def test_matching_thresholds_best_per_ground_truth_padding_and_empty_images():
    valid = torch.tensor([[True, True, True, True, False]])
    gt_valid = torch.tensor([[True, True, False]])
    matches, labels = match_boxes(BOXES, valid, GT, gt_valid, 0.7, 0.3, allow_low_quality=False)
    assert labels.tolist() == [[1, 1, -1, 0, -1]]  # IoU 1, 0.9, 0.68 (ignored), 0, padding
    assert matches[0, :2].tolist() == [0, 0]
    _, labels = match_boxes(BOXES, valid, GT, gt_valid, 0.7, 0.3, allow_low_quality=True)
    assert labels.tolist() == [[1, 1, 1, 0, -1]]  # box 2 is the second ground truth's best
    _, labels = match_boxes(BOXES, valid, GT, torch.zeros_like(gt_valid), 0.7, 0.3, True)
    assert labels.tolist() == [[0, 0, 0, 0, -1]]  # no ground truth: all background


def test_sampling_counts_and_order_without_randomness():
    labels = torch.tensor([[1, 0, 1, 1, 0, 0, -1, 0, 1, 0]])
    fg, bg = sample_labels(labels, num_samples=6, fg_fraction=0.5, use_random=False)
    assert fg.nonzero()[:, 1].tolist() == [0, 2, 3]  # the first 3 foreground
    assert bg.nonzero()[:, 1].tolist() == [1, 4, 5]  # then background up to 6
    fg, bg = sample_labels(torch.tensor([[1, 0, 0, 0, 0, -1]]), 4, 0.5, False)
    assert fg.sum() == 1 and bg.sum() == 3  # few foreground: background fills the sample


def test_random_sampling_is_uniform_and_bounded():
    labels = torch.tensor([[1] * 10 + [0] * 100])
    generator = torch.Generator().manual_seed(0)
    hits = torch.zeros(110)
    for _ in range(300):
        fg, bg = sample_labels(labels, 20, 0.25, True, generator)
        assert fg.sum() == 5 and bg.sum() == 15 and not (fg & bg).any()
        hits += (fg | bg)[0].float()
    assert 0.35 < hits[:10].mean() / 300 < 0.65 and 0.1 < hits[10:].mean() / 300 < 0.2


def test_compact_puts_the_selection_first_and_deltas_invert():
    mask = torch.tensor([[False, True, False, True]])
    assert compact(mask, 3).tolist() == [[1, 3, 0]]
    boxes, gt = (
        BOXES[0, :4],
        torch.tensor([[1, 2, 12, 9], [0, 0, 9, 12], [18, 22, 33, 31], [40, 45, 70, 66.0]]),
    )
    deltas = bbox2delta(boxes, gt, (10, 10, 5, 5))
    assert torch.allclose(delta2bbox(deltas, boxes, (10, 10, 5, 5))[:, 0], gt, atol=1e-4)
