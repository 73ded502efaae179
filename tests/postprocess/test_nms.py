"""Multi-class NMS: thresholds, per-class top-k, per-class suppression, keep_top_k, rescaling; the
batch at once equals every image alone (torchvision per class), with a fixed number of host reads."""

import pytest
import torch
import torchvision

from ppdist.postprocess.nms import MultiClassNMS, multiclass_nms, multiclass_nms_batch, per_class_top_k
from ppdist.utils.host_sync import HostSyncCounter


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


def _tied_detections(batch, classes, anchors, seed, levels, integer=False):
    """Scores on ``levels`` values (many ties); boxes of 4..84 px among 300 px, optionally integral."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.floor(torch.rand(batch, classes, anchors, generator=gen) * levels) / levels
    xy = torch.rand(batch, anchors, 2, generator=gen) * 300
    wh = torch.rand(batch, anchors, 2, generator=gen) * 80 + 4
    if integer:
        xy, wh = xy.floor(), wh.floor()
    return scores, torch.cat([xy, xy + wh], dim=-1)


def _per_class_reference(scores, boxes, score_threshold, nms_top_k, nms_threshold, keep_top_k):
    """One image, one class at a time, with torchvision.ops.nms: (label, score, box) rows, best
    first, equal scores by class then anchor."""
    rows = []
    for label in range(scores.shape[0]):
        (anchors,) = torch.nonzero(scores[label] > score_threshold, as_tuple=True)
        order = torch.argsort(scores[label, anchors], descending=True, stable=True)
        anchors = anchors[order[:nms_top_k] if nms_top_k > -1 else order]
        kept = torchvision.ops.nms(boxes[anchors], scores[label, anchors], nms_threshold)
        rows += [(float(-scores[label, a]), label, int(a)) for a in anchors[kept].tolist()]
    rows = sorted(rows)[:keep_top_k] if keep_top_k > -1 else sorted(rows)
    labels = torch.tensor([label for _, label, _ in rows], dtype=torch.long)
    anchors = torch.tensor([anchor for _, _, anchor in rows], dtype=torch.long)
    return labels, scores[labels, anchors], boxes[anchors]


@pytest.mark.parametrize(
    "shape,levels,integer,args",
    [
        ((3, 24, 1500), 24, False, (0.5, 1000, 0.5, 300)),  # ~17k candidates per image, ties, top-k cuts
        ((2, 12, 700), 8, True, (0.25, 100, 0.6, 40)),  # ties, few candidates
        ((2, 6, 900), 32, False, (0.5, -1, 0.7, -1)),  # no top-k, everything kept
    ],
)
def test_the_batch_at_once_equals_every_image_alone(shape, levels, integer, args):
    """Exactly (order of equal scores included) torchvision's NMS per class and the per-image
    ``multiclass_nms``, whose ``batched_nms`` loops over the classes past 1000 boxes on the CPU
    (5000 on CUDA) and otherwise offsets the boxes by class (integral boxes: no rounding there)."""
    scores, boxes = _tied_detections(*shape, seed=sum(shape), levels=levels, integer=integer)
    found = multiclass_nms_batch(scores, boxes, *args)
    assert found["image"].tolist() == sorted(found["image"].tolist())
    for b in range(shape[0]):
        mine = {key: found[key][found["image"] == b] for key in ("labels", "scores", "boxes")}
        per_image = multiclass_nms(scores[b], boxes[b], *args)
        labels, values, kept_boxes = _per_class_reference(scores[b], boxes[b], *args)
        assert torch.equal(mine["labels"], labels) and torch.equal(per_image["labels"], labels)
        assert torch.equal(mine["scores"], values) and torch.equal(per_image["scores"], values)
        assert torch.equal(mine["boxes"], kept_boxes) and torch.equal(per_image["boxes"], kept_boxes)
        if args[1] == 1000:
            assert (scores[b] > args[0]).sum() > 5000 and len(labels) == args[
                3
            ]  # the loop path, cut by keep_top_k


def test_the_post_process_maps_every_image_back_and_reads_the_host_six_times():
    """Per batch (image ids and scale factors on the host, as the evaluator leaves them): the
    candidates, the group sizes, one read per suppression round (two here: the second finds
    nothing left to change), the kept rows, their transfer. The per-image loop read 5 per image
    (d9515f6: 40 for these 8 images, plus on CUDA the copy inside each torchvision ``nms``, which
    the counter does not see)."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.rand(8, 20, 600, generator=gen) ** 400  # ~140 candidates per image
    xy = torch.rand(8, 600, 2, generator=gen) * 300
    boxes = torch.cat([xy, xy + torch.rand(8, 600, 2, generator=gen) * 80 + 4], dim=-1)
    batch = {
        "im_id": torch.arange(10, 18).reshape(8, 1),
        "scale_factor": torch.rand(8, 2, generator=gen) + 0.5,
    }
    post = MultiClassNMS(score_threshold=0.01, nms_threshold=0.5)
    assert set(post.host_keys) == {"im_id", "scale_factor"}
    with HostSyncCounter(host=list(batch.values())) as counter:
        results = post({"scores": scores, "boxes": boxes}, batch)
    assert counter.count == 6, counter.report()
    assert [r["im_id"] for r in results] == list(range(10, 18))
    for b, result in enumerate(results):
        want = multiclass_nms(scores[b], boxes[b], 0.01, 1000, 0.5, 300)
        h, w = batch["scale_factor"][b].tolist()
        assert len(want["labels"]) > 0 and torch.equal(result["labels"], want["labels"])
        assert torch.equal(result["scores"], want["scores"])
        assert torch.equal(result["boxes"], want["boxes"] / torch.tensor([w, h, w, h]))
