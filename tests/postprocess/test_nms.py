"""Multi-class NMS: thresholds, per-class top-k, per-class suppression, keep_top_k, rescaling."""
import torch

from ppdist.postprocess.nms import MultiClassNMS, multiclass_nms, per_class_top_k


def test_per_class_top_k_keeps_best_of_each_class():
    scores = torch.tensor([0.9, 0.2, 0.8, 0.7, 0.6, 0.1])
    labels = torch.tensor([0, 0, 1, 0, 1, 1])
    kept = per_class_top_k(scores, labels, 2).tolist()
    assert sorted(kept) == [0, 2, 3, 4]


def test_nms_suppresses_within_a_class_only_and_applies_thresholds():
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 10, 10], [50, 50, 60, 60]], dtype=torch.float32)
    scores = torch.zeros(2, 4)
    scores[0, 0], scores[0, 1], scores[0, 3] = 0.9, 0.8, 0.01  # 0.01 is not > threshold
    scores[1, 2] = 0.5  # same box as anchor 0 but another class: kept
    out = multiclass_nms(scores, boxes, score_threshold=0.01, nms_top_k=1000, nms_threshold=0.7, keep_top_k=300)
    # IoU(box0, box1) = 81/100 > 0.7 -> box1 suppressed
    assert out["labels"].tolist() == [0, 1] and out["scores"].tolist() == [0.8999999761581421, 0.5]
    out = multiclass_nms(scores, boxes, 0.01, 1000, 0.7, keep_top_k=1)
    assert out["labels"].tolist() == [0]


def test_boxes_are_mapped_back_by_scale_factor():
    post = MultiClassNMS()
    preds = {"scores": torch.tensor([[[0.9]]]), "boxes": torch.tensor([[[10.0, 20.0, 30.0, 60.0]]])}
    batch = {"scale_factor": torch.tensor([[2.0, 0.5]]), "im_id": torch.tensor([[7]])}
    (result,) = post(preds, batch)
    assert result["im_id"] == 7
    assert result["boxes"].tolist() == [[20.0, 10.0, 60.0, 30.0]]  # x / 0.5, y / 2
