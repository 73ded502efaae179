"""Segmentation metrics against a hand-computed confusion; exact merging of rank states."""

import numpy as np
import pytest
import torch

from ppdist.metrics.seg import SegMetric, class_areas, metrics_from_areas


def test_areas_and_formulas_on_hand_computed_example():
    label = torch.tensor([[0, 0, 1, 1], [2, 2, 255, 1]])
    pred = torch.tensor([[0, 1, 1, 1], [2, 0, 2, 1]])
    areas = class_areas(pred, label, num_classes=4)
    # valid pixels 7: (l,p) = (0,0),(0,1),(1,1),(1,1),(2,2),(2,0),(1,1)
    assert areas.tolist() == [[1, 3, 1, 0], [2, 4, 1, 0], [2, 3, 2, 0]]
    m = metrics_from_areas(*areas)
    iou = [1 / 3, 3 / 4, 1 / 2, 0.0]  # class 3: empty union counts as 0, as in PaddleSeg
    assert m["class_iou"] == pytest.approx(iou)
    assert m["miou"] == pytest.approx(sum(iou) / 4)
    assert m["acc"] == pytest.approx(5 / 7)
    assert m["class_precision"] == pytest.approx([1 / 2, 3 / 4, 1.0, 0.0])
    assert m["class_recall"] == pytest.approx([1 / 2, 1.0, 1 / 2, 0.0])
    pe = (2 * 2 + 4 * 3 + 1 * 2) / 49
    assert m["kappa"] == pytest.approx((5 / 7 - pe) / (1 - pe))
    assert m["class_dice"] == pytest.approx([2 / 4, 6 / 7, 2 / 3, 0.0])
    assert m["mdice"] == pytest.approx((2 / 4 + 6 / 7 + 2 / 3) / 4)


def test_merged_states_equal_single_pass_exactly():
    rng = np.random.default_rng(0)
    labels = [torch.as_tensor(rng.integers(0, 5, (1, 17, 23))) for _ in range(7)]
    preds = [torch.as_tensor(rng.integers(0, 5, (1, 17, 23))) for _ in range(7)]
    for lab in labels:
        lab[lab == 4] = 255
    whole = SegMetric(num_classes=5)
    for p, lab in zip(preds, labels):
        whole.update(p, {"label": lab})
    shards = []
    for part in ((0, 3), (3, 7)):
        m = SegMetric(num_classes=5)
        for p, lab in zip(preds[part[0] : part[1]], labels[part[0] : part[1]]):
            m.update(p, {"label": lab})
        shards.append(m.state())
    merged = SegMetric(num_classes=5)
    merged.load_states(shards)
    assert merged.compute() == whole.compute()
    assert whole.compute()["images"] == 7


def test_shape_mismatch_and_bad_indicator_raise():
    with pytest.raises(ValueError, match="main_indicator"):
        SegMetric(num_classes=2, main_indicator="dice")
    with pytest.raises(ValueError, match="shape"):
        SegMetric(num_classes=2).update(torch.zeros(1, 2, 2), {"label": torch.zeros(1, 3, 3)})
