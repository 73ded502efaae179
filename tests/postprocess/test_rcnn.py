"""BBoxPostProcess (RCNNBox decode + MultiClassNMS + get_pred) against PaddleDetection's own.

The fixture (tests/fixtures/faster_rcnn/post_process.npz, written by make_post_process.py beside
it with paddlepaddle 2.6.2 and PaddleDetection release/2.7.1) holds a 2-image batch of RoIs
(40 and 33, clustered, 3 per image outside the image), deltas and class probabilities for 4
classes, the original's NMS rows on the network input and get_pred's rows on the original image
(keep_top_k 25 cuts both images). ppdist gets the RoIs padded with a mask (the padding holds
confident garbage) and must give the same detections: labels and counts exact, scores within
1e-6, boxes within 1e-3. The order differs and is compared sorted: PaddleDetection's rows come by
class, ppdist's best first per image (MultiClassNMS's format; COCO evaluation sorts by score).
The fixture has clipped empty boxes that touch: Paddle's NMS suppresses the lower one (IoU 0 / 0),
torchvision's would keep it and push a real detection past keep_top_k (``empty_overlap``).
Measured: boxes within 3.8e-6 px, scores equal.
"""

import os

import numpy as np
import pytest
import torch

from ppdist.errors import ConfigError
from ppdist.ops.box_coder import BBOX_CLIP, delta2bbox
from ppdist.registry import HEADS, POSTPROCESSES

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "faster_rcnn", "post_process.npz")
NMS = {"name": "MultiClassNMS", "keep_top_k": 25, "score_threshold": 0.05, "nms_threshold": 0.5}


@pytest.fixture(scope="module")
def data():
    return dict(np.load(FIXTURE))


def preds_and_batch(data):
    counts = data["rois_num"].tolist()
    width = max(counts)
    starts = np.cumsum([0] + counts)
    rois = torch.full((2, width, 4), 5.0)
    rois[..., 2:] = 60.0
    deltas = torch.zeros(2, width, 16)
    probs = torch.full((2, width, 5), 0.0)
    probs[..., 0] = 1.0  # padding: confident class 0
    mask = torch.zeros(2, width, dtype=torch.bool)
    for i, count in enumerate(counts):
        part = slice(starts[i], starts[i + 1])
        rois[i, :count] = torch.from_numpy(data["rois"][part])
        deltas[i, :count] = torch.from_numpy(data["bbox_delta"][part])
        probs[i, :count] = torch.from_numpy(data["bbox_prob"][part])
        mask[i, :count] = True
    preds = {"rois": rois, "rois_mask": mask, "bbox_delta": deltas, "bbox_prob": probs}
    batch = {
        "im_shape": torch.from_numpy(data["im_shape"]),
        "scale_factor": torch.from_numpy(data["scale_factor"]),
        "im_id": torch.tensor([[7], [9]]),
    }
    return preds, batch


def by_label_then_score(rows: np.ndarray) -> np.ndarray:
    """[M, 6] rows (label, score, box) sorted by label, then score (best first)."""
    return rows[np.lexsort((-rows[:, 1], rows[:, 0]))]


def build_for(num_classes: int):
    return POSTPROCESSES.build(
        {"name": "BBoxPostProcess", "num_classes": num_classes, "decode": "RCNNBox", "nms": NMS}
    )


def build():
    return build_for(4)


def test_detections_match_paddle(data):
    preds, batch = preds_and_batch(data)
    results = build()(preds, batch)
    theirs_all = np.split(data["pred"], np.cumsum(data["bbox_num"])[:-1])
    assert [r["im_id"] for r in results] == [7, 9]
    for mine, theirs in zip(results, theirs_all):
        theirs = by_label_then_score(theirs[theirs[:, 0] >= 0])  # get_pred's -1: empty boxes
        rows = torch.cat(
            [mine["labels"][:, None].float(), mine["scores"][:, None], mine["boxes"]], dim=1
        ).numpy()
        assert np.all(np.diff(rows[:, 1]) <= 0), "best first"
        rows = by_label_then_score(rows)
        assert rows.shape == theirs.shape
        np.testing.assert_array_equal(rows[:, 0], theirs[:, 0])
        np.testing.assert_allclose(rows[:, 1], theirs[:, 1], atol=1e-6, rtol=0)
        np.testing.assert_allclose(rows[:, 2:], theirs[:, 2:], atol=1e-3, rtol=0)


def test_network_input_detections_match_paddle(data):
    """Before get_pred: the NMS keeps the same rows (empty boxes included) on the network input."""
    preds, batch = preds_and_batch(data)
    found = build().detections(preds, batch["im_shape"])
    counts = torch.bincount(found["image"], minlength=2).tolist()
    assert counts == data["bbox_num"].tolist()
    rows = torch.cat(
        [found["labels"][:, None].float(), found["scores"][:, None], found["boxes"]], dim=1
    ).numpy()
    starts = np.cumsum([0] + counts)
    for i in range(2):
        mine = by_label_then_score(rows[starts[i] : starts[i + 1]])
        theirs = by_label_then_score(data["nms_bbox"][starts[i] : starts[i + 1]])
        np.testing.assert_array_equal(mine[:, 0], theirs[:, 0])
        np.testing.assert_allclose(mine[:, 1:], theirs[:, 1:], atol=1e-4, rtol=0)


def test_delta2bbox_weights_and_clip():
    boxes = torch.tensor([[10.0, 20.0, 30.0, 60.0]])  # w 20, h 40, centre (20, 40)
    deltas = torch.tensor([[10.0, -10.0, 0.0, 100.0]])
    got = delta2bbox(deltas, boxes, (10.0, 10.0, 5.0, 5.0))
    # dx = 1 -> cx 40; dy = -1 -> cy 0; dw = 0 -> w 20; dh = 20 clipped to log(62.5) -> h 40 * 62.5
    h = 40.0 * np.exp(BBOX_CLIP)
    np.testing.assert_allclose(got[0, 0].numpy(), [30.0, -h / 2, 50.0, h / 2], rtol=1e-6)
    clipped = delta2bbox(deltas, boxes, (10.0, 10.0, 5.0, 5.0), max_shape=torch.tensor([[100.0, 45.0]]))
    np.testing.assert_allclose(clipped[0, 0].numpy(), [30.0, 0.0, 45.0, 100.0], rtol=1e-6)


def test_unsupported_settings_fail_clearly():
    with pytest.raises(ConfigError, match="nms_eta"):
        POSTPROCESSES.build({"name": "BBoxPostProcess", "nms": {"name": "MultiClassNMS", "nms_eta": 0.5}})
    with pytest.raises(ConfigError, match="RCNNBox"):
        POSTPROCESSES.build({"name": "BBoxPostProcess", "decode": "DETRBox"})


def test_the_eval_chain_fits_together():
    """RPNHead's padded proposals -> BBoxHead -> BBoxPostProcess: one dict per image with boxes on
    the original image (inside it), labels of real classes, scores over the threshold, best first.
    (That padding never scores is test_detections_match_paddle's confident padding.)"""
    torch.manual_seed(0)
    anchors = {
        "anchor_sizes": [[8], [16], [32], [64], [128]],
        "aspect_ratios": [0.5, 1.0, 2.0],
        "strides": [4, 8, 16, 32, 64],
    }
    rpn = HEADS.build({"name": "RPNHead", "anchor_generator": anchors, "in_channel": 8}).eval()
    head = HEADS.build(
        {
            "name": "BBoxHead",
            "head": {"name": "TwoFCHead", "out_channel": 16},
            "num_classes": 3,
            "feat_channel": 8,
        }
    ).eval()
    torch.nn.init.normal_(head.bbox_score.weight, 0.0, 1.0)  # confident classes, so detections pass 0.05
    feats = [torch.randn(2, 8, 64 // s, 64 // s) for s in (4, 8, 16, 32, 64)]
    batch = {
        "im_shape": torch.tensor([[64.0, 64.0], [40.0, 48.0]]),
        "scale_factor": torch.tensor([[2.0, 2.0], [0.5, 0.75]]),
        "im_id": torch.tensor([[1], [2]]),
    }
    with torch.no_grad():
        proposals = rpn(feats, batch["im_shape"])
        preds = head(feats, proposals["rois"], proposals["rois_mask"])
    assert not bool(proposals["rois_mask"].all())  # padded: fewer survive than the width
    results = build_for(3)(preds, batch)
    assert [r["im_id"] for r in results] == [1, 2]
    origin = [(32.0, 32.0), (80.0, 64.0)]  # (h, w) = im_shape / scale_factor
    for result, (height, width) in zip(results, origin):
        boxes = result["boxes"]
        assert boxes.shape[0] > 0 and result["labels"].max() < 3 and result["scores"].min() > 0.05
        assert bool((boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all() and (boxes >= 0).all())
        assert bool((result["scores"][1:] <= result["scores"][:-1]).all())


def graph_rows(post, preds, batch):
    bbox, num = post.graph_outputs(preds, batch["im_shape"].float(), batch["scale_factor"].float())
    return bbox.split(num.tolist())


def eval_rows(result):
    return torch.cat([result["labels"][:, None].float(), result["scores"][:, None], result["boxes"]], dim=1)


def test_exported_graph_outputs_equal_evaluation(data):
    """``graph_outputs`` (tensor operations only, what export traces) gives evaluation's detections
    row for row, where keep_top_k cuts nothing; where it cuts, an empty box that Paddle's NMS
    suppresses (``empty_overlap``) keeps a place in torchvision's, so the graph's rows are
    evaluation's first rows, at most one fewer per such box (fixture: 22 of 23 in image 0)."""
    preds, batch = preds_and_batch(data)
    post = POSTPROCESSES.build(
        {"name": "BBoxPostProcess", "num_classes": 4, "nms": dict(NMS, keep_top_k=100)}
    )
    for mine, result in zip(graph_rows(post, preds, batch), post(preds, batch)):
        assert mine.shape[0] == len(result["boxes"]) > 20
        assert torch.equal(mine, eval_rows(result))
    post = build()  # keep_top_k 25
    counts = []
    for mine, result in zip(graph_rows(post, preds, batch), post(preds, batch)):
        assert torch.equal(mine, eval_rows(result)[: mine.shape[0]])
        counts.append((mine.shape[0], len(result["boxes"])))
    assert counts == [(22, 23), (23, 23)]
    with pytest.raises(ValueError, match="keeps its NMS"):
        post.graph_outputs(preds, batch["im_shape"].float(), batch["scale_factor"].float(), exclude_nms=True)
