"""Multi-class NMS: thresholds, per-class top-k, per-class suppression, keep_top_k, rescaling."""

import pytest
import torch

from ppdist.postprocess.nms import MultiClassNMS, multiclass_nms, per_class_top_k


def test_per_class_top_k_keeps_best_of_each_class():
    scores = torch.tensor([0.9, 0.2, 0.8, 0.7, 0.6, 0.1])
    labels = torch.tensor([0, 0, 1, 0, 1, 1])
    kept = per_class_top_k(scores, labels, 2).tolist()
    assert sorted(kept) == [0, 2, 3, 4]


def test_nms_suppresses_within_a_class_only_and_applies_thresholds():
    boxes = torch.tensor(
        [[0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 10, 10], [50, 50, 60, 60]], dtype=torch.float32
    )
    scores = torch.zeros(2, 4)
    scores[0, 0], scores[0, 1], scores[0, 3] = 0.9, 0.8, 0.01  # 0.01 is not > threshold
    scores[1, 2] = 0.5  # same box as anchor 0 but another class: kept
    out = multiclass_nms(
        scores, boxes, score_threshold=0.01, nms_top_k=1000, nms_threshold=0.7, keep_top_k=300
    )
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


def _random_detections(batch, classes, anchors, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(batch, classes, anchors, generator=gen) ** 4
    xy = torch.rand(batch, anchors, 2, generator=gen) * 300
    boxes = torch.cat([xy, xy + torch.rand(batch, anchors, 2, generator=gen) * 80 + 4], dim=-1)
    return scores, boxes


def _canonical(rows):
    """Rows (label, score, box) in a fixed order: by score, then label, then x1."""
    order = sorted(
        range(rows.shape[0]), key=lambda i: (-float(rows[i, 1]), float(rows[i, 0]), float(rows[i, 2]))
    )
    return rows[order]


def test_batched_multiclass_nms_equals_the_per_image_version():
    from ppdist.postprocess.nms import batched_multiclass_nms, multiclass_nms

    scores, boxes = _random_detections(3, 5, 400, seed=0)
    for args in [(0.05, 50, 0.5, 30), (0.3, -1, 0.6, -1), (0.9, 1000, 0.7, 300)]:
        bbox, num = batched_multiclass_nms(scores, boxes, *args)
        start = 0
        for b in range(3):
            ref = multiclass_nms(scores[b], boxes[b], *args)
            got = bbox[start : start + int(num[b])]
            start += int(num[b])
            expected = torch.cat(
                [ref["labels"].unsqueeze(1).float(), ref["scores"].unsqueeze(1), ref["boxes"]], 1
            )
            assert torch.allclose(got[:, 1], expected[:, 1])  # best first (equal scores may swap places)
            assert torch.allclose(_canonical(got), _canonical(expected))
        assert start == bbox.shape[0]


def test_batched_multiclass_nms_exports_to_onnx_with_dynamic_batch_and_anchors():
    ort = pytest.importorskip("onnxruntime")
    import io

    from ppdist.postprocess.nms import batched_multiclass_nms

    class NMS(torch.nn.Module):
        def forward(self, scores, boxes):
            return batched_multiclass_nms(scores, boxes, 0.05, 50, 0.5, 30)

    buffer = io.BytesIO()
    torch.onnx.export(
        NMS(),
        _random_detections(2, 5, 300, seed=1),
        buffer,
        opset_version=17,
        dynamo=False,
        input_names=["scores", "boxes"],
        output_names=["bbox", "bbox_num"],
        dynamic_axes={"scores": {0: "n", 2: "a"}, "boxes": {0: "n", 1: "a"}},
    )
    session = ort.InferenceSession(buffer.getvalue())
    for batch, anchors, seed in [(3, 400, 2), (1, 900, 3)]:
        scores, boxes = _random_detections(batch, 5, anchors, seed)
        expected_bbox, expected_num = batched_multiclass_nms(scores, boxes, 0.05, 50, 0.5, 30)
        bbox, num = session.run(None, {"scores": scores.numpy(), "boxes": boxes.numpy()})
        assert num.tolist() == expected_num.tolist()
        assert abs(bbox - expected_bbox.numpy()).max() < 1e-4
