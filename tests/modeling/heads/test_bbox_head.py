"""RoIAlign over FPN levels and BBoxHead (TwoFCHead) against PaddleDetection's own modules.

The fixture (tests/fixtures/faster_rcnn/bbox_head.npz, written by make_bbox_head.py beside it with
paddlepaddle 2.6.2 and PaddleDetection release/2.7.1) holds random weights, FPN features (P2..P6,
8 channels) and RoIs of 2..900 px (one empty) for a 2-image batch, with the original's RoIAlign
output and head outputs (deltas, softmax scores). ppdist gets the RoIs padded to one width with a
mask; its outputs for the valid RoIs must match within 1e-4. The weights go through ppdist's Paddle
weights converter by their Paddle names (``bbox_head.head.fc6.weight`` in Paddle's [in, out]
layout, ...): nothing missing, skipped or unused.
"""

import os

import numpy as np
import pytest
import torch
from torch import nn

from ppdist.convert.weights import convert_state_dict
from ppdist.modeling.heads.bbox_head import BBoxHead
from ppdist.ops.roi_align import fpn_levels
from ppdist.registry import HEADS
from ppdist.utils.host_sync import HostSyncCounter

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "faster_rcnn", "bbox_head.npz")


@pytest.fixture(scope="module")
def data():
    return dict(np.load(FIXTURE))


def build_head(data) -> BBoxHead:
    head = HEADS.build(
        {
            "name": "BBoxHead",
            "head": {"name": "TwoFCHead", "out_channel": 32},
            "roi_extractor": {"resolution": 7, "sampling_ratio": 0, "aligned": True},
            "num_classes": 4,
            "feat_channel": 8,
        }
    )
    # through the weights converter, by Paddle's names (``bbox_head.head.fc6.weight``, [in, out])
    model = nn.Module()
    model.bbox_head = head
    paddle_state = {f"bbox_head.{k[2:]}": v for k, v in data.items() if k.startswith("w:")}
    state, report = convert_state_dict(model, paddle_state, "bbox_head.npz")
    assert not report.missing and not report.skipped and not report.unused, report.lines()
    model.load_state_dict(state)
    return head.eval()


def padded_rois(data):
    """[2, 30, 4] with a mask; the second image's padding holds garbage boxes."""
    counts = data["rois_num"].tolist()
    parts = np.split(data["rois"], np.cumsum(counts)[:-1])
    width = max(counts)
    rois = torch.full((len(counts), width, 4), 1e4)
    mask = torch.zeros(len(counts), width, dtype=torch.bool)
    for i, part in enumerate(parts):
        rois[i, : len(part)] = torch.from_numpy(part)
        mask[i, : len(part)] = True
    return rois, mask


def feats(data):
    return [torch.from_numpy(data[f"feat{i}"]) for i in range(5)]


def test_roi_align_matches_paddle(data):
    head = build_head(data)
    rois, mask = padded_rois(data)
    with torch.no_grad():
        pooled = head.roi_extractor(feats(data), rois)
    assert pooled.shape == (rois.shape[0] * rois.shape[1], 8, 7, 7)
    got = pooled[mask.reshape(-1)].numpy()
    np.testing.assert_allclose(got, data["roi_feat"], atol=1e-4, rtol=0)


def test_levels_cover_every_pooled_level(data):
    """The fixture exercises P2..P5 (and both clamps): the test above checks each of them."""
    levels = fpn_levels(torch.from_numpy(data["rois"]), 2, 5)
    assert set(levels.tolist()) == {2, 3, 4, 5}


def test_level_rule():
    """Paddle's distribute_fpn_proposals: floor(4 + log2(sqrt(area) / 224 + 1e-6)), clamped."""
    sides = torch.tensor([0.0, 111.0, 112.0, 223.0, 224.0, 447.0, 448.0, 5000.0])
    boxes = torch.stack([torch.zeros_like(sides), torch.zeros_like(sides), sides, sides], dim=1)
    assert fpn_levels(boxes, 2, 5).tolist() == [2, 2, 3, 3, 4, 4, 5, 5]
    inverted = torch.tensor([[10.0, 10.0, 0.0, 500.0]])
    assert fpn_levels(inverted, 2, 5).tolist() == [2]


def test_head_matches_paddle(data):
    head = build_head(data)
    rois, mask = padded_rois(data)
    with torch.no_grad():
        out = head(feats(data), rois, mask)
    assert out["bbox_score"].shape == (2, 30, 5) and out["bbox_delta"].shape == (2, 30, 16)
    np.testing.assert_allclose(out["bbox_delta"][mask].numpy(), data["bbox_delta"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(out["bbox_prob"][mask].numpy(), data["bbox_prob"], atol=1e-4, rtol=0)
    assert out["rois_mask"] is mask


def test_training_forward_reads_nothing_on_the_host(data):
    head = build_head(data).train()
    rois, mask = padded_rois(data)
    with HostSyncCounter() as counter:
        out = head(feats(data), rois, mask)
        (out["bbox_score"].sum() + out["bbox_delta"].sum()).backward()
    assert counter.count == 0, counter.report()


def test_paddle_initialisers():
    torch.manual_seed(0)
    head = BBoxHead(head={"name": "TwoFCHead", "out_channel": 1024}, num_classes=80, feat_channel=256)
    fan = 256 * 7 * 7
    fc6 = head.head.fc6.weight
    assert fc6.shape == (1024, fan) and fc6.abs().max() <= (6.0 / (2 * fan)) ** 0.5
    assert (
        fc6.abs().max() > 0.9 * (6.0 / (2 * fan)) ** 0.5
    )  # uniform up to the Xavier bound with fan_out = fan
    assert abs(head.bbox_score.weight.std().item() - 0.01) < 1e-3
    assert abs(head.bbox_delta.weight.std().item() - 0.001) < 1e-4
    assert head.bbox_score.out_features == 81 and head.bbox_delta.out_features == 320
    assert all(
        float(b.detach().abs().max()) == 0.0
        for b in (head.bbox_score.bias, head.bbox_delta.bias, head.head.fc7.bias)
    )
    names = {k for k, _ in head.named_parameters()}
    assert {"head.fc6.weight", "head.fc7.bias", "bbox_score.weight", "bbox_delta.bias"} <= names


def test_autocast_pools_in_float32(data):
    """bf16 features under autocast: the RoIs are pooled in float32 (corners not rounded to bf16),
    so the pooled features stay close to float32's."""
    head = build_head(data)
    rois, mask = padded_rois(data)
    x = [f.to(torch.bfloat16) for f in feats(data)]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        pooled = head.roi_extractor(x, rois)
        out = head(x, rois, mask)
    reference = head.roi_extractor([f.float() for f in x], rois)
    assert pooled.dtype == torch.float32 and torch.equal(pooled, reference)
    assert out["bbox_prob"].dtype == torch.float32
