"""ppdist.losses.rcnn_targets against PaddleDetection's RPNTargetAssign / BBoxAssigner
(tests/fixtures/faster_rcnn/make_targets.py, use_random=False), plus use_random statistics and
the no-host-read rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rcnn_targets_testing import load_targets_fixture, roi_targets, rpn_targets

import ppdist.losses  # noqa: F401  (registers BBoxAssigner)
from ppdist.errors import DataError
from ppdist.losses.rcnn_targets import rpn_anchor_target
from ppdist.ops.box_coder import bbox2delta
from ppdist.registry import HEADS
from ppdist.utils.host_sync import HostSyncCounter


@pytest.fixture(scope="module")
def fx():
    return load_targets_fixture()


def test_bbox2delta_inverts_known_boxes():
    src = torch.tensor([[0.0, 0.0, 10.0, 20.0]])
    tgt = torch.tensor([[5.0, 0.0, 25.0, 20.0]])
    got = bbox2delta(src, tgt, (10.0, 10.0, 5.0, 5.0))
    want = torch.tensor([[10.0 * 10.0 / 10.0, 0.0, 5.0 * float(np.log(2.0)), 0.0]])
    torch.testing.assert_close(got, want)


def test_rpn_labels_and_deltas_equal_paddle(fx):
    out = rpn_targets(fx)
    assert torch.equal(out["labels"].int(), fx["rpn_labels"].int())
    pos = fx["rpn_labels"] == 1
    torch.testing.assert_close(out["deltas"][pos], fx["rpn_deltas_tgt"][pos], atol=1e-5, rtol=1e-5)
    assert out["norm"] == float(fx["rpn_norm"])


def test_bbox_assign_equals_paddle(fx):
    out = roi_targets(fx)
    counts = fx["sampled_counts"]
    assert torch.equal(out["rois_mask"].sum(1), counts.to(torch.int64))
    assert torch.equal(out["tgt_labels"], fx["sampled_labels"].to(torch.int64))
    torch.testing.assert_close(out["rois"][out["rois_mask"]], fx["sampled_rois"][out["rois_mask"]])
    fg = (out["tgt_labels"] >= 0) & (out["tgt_labels"] < 4)
    torch.testing.assert_close(out["tgt_bboxes"][fg], fx["sampled_gt"][fg])


def test_crowd_gt_is_never_a_match(fx):
    out = roi_targets(fx)
    fg = (out["tgt_labels"] >= 0) & (out["tgt_labels"] < 4)
    assert not ((out["tgt_gt_inds"] == 3) & fg)[0].any()
    rpn = rpn_targets(fx)
    assert (rpn["labels"] >= 0).sum(1).le(64).all()


def test_no_valid_gt_gives_only_background(fx):
    mask = torch.zeros_like(fx["gt_mask"])
    out = rpn_anchor_target(fx["anchors"], fx["gt_bbox"], mask, None, batch_size_per_im=64, use_random=False)
    assert torch.equal((out["labels"] == 0).sum(1), torch.tensor([64, 64]))
    assert not (out["labels"] == 1).any()


def test_use_random_keeps_counts_and_varies_choice(fx):
    torch.manual_seed(0)
    ref = rpn_targets(fx)
    a, b = rpn_targets(fx, use_random=True), rpn_targets(fx, use_random=True)
    for out in (a, b):
        for lab in (0, 1):
            assert torch.equal((out["labels"] == lab).sum(1), (ref["labels"] == lab).sum(1))
    assert not torch.equal(a["labels"], b["labels"])  # 56 of ~380 negatives: a repeat is ~impossible
    # every negative candidate is chosen at the same rate p = 56 / #candidates (binomial spread,
    # std ~0.025 over 200 draws); a fixed or biased choice gives rates of 0 and 1
    hits = torch.zeros(fx["anchors"].shape[0])
    for _ in range(200):
        hits += (rpn_targets(fx, use_random=True)["labels"][0] == 0).float()
    neg = (ref["labels"][0] != 1) & (hits > 0)
    rate = hits[neg] / 200
    p = 56 / neg.sum().item()
    assert neg.sum().item() > 200 and (rate - p).abs().max().item() < 0.12
    r = roi_targets(fx, use_random=True)
    assert torch.equal(r["rois_mask"].sum(1), fx["sampled_counts"].to(torch.int64))
    assert torch.equal(((r["tgt_labels"] >= 0) & (r["tgt_labels"] < 4)).sum(1), torch.tensor([8, 8]))


def test_targets_read_nothing_on_host(fx):
    with HostSyncCounter() as counter:
        rpn_targets(fx, use_random=True)
        roi_targets(fx, use_random=True)
        rpn_targets(fx)
        roi_targets(fx)
    assert counter.count == 0, counter.report()


def test_registered_bbox_assigner_reads_the_batch(fx):
    assigner = HEADS.build(
        {"name": "BBoxAssigner", "batch_size_per_im": 32, "use_random": False, "num_classes": 4}
    )
    batch = {
        "gt_bbox": fx["gt_bbox"],
        "gt_class": fx["gt_class"],
        "pad_gt_mask": fx["gt_mask"].float()[..., None],
        "is_crowd": fx["is_crowd"],
    }
    out = assigner(fx["rois"], fx["rois_mask"], batch)
    assert torch.equal(out["tgt_labels"], fx["sampled_labels"].to(torch.int64))
    with pytest.raises(DataError, match="gt_class"):
        assigner(fx["rois"], fx["rois_mask"], {"gt_bbox": fx["gt_bbox"]})


def test_rpn_ignore_thresh_near_crowd_equals_paddle(fx):
    out = rpn_targets(fx, ignore_thresh=0.3)
    assert torch.equal(out["labels"].int(), fx["rpn_labels_ignore"].int())
    assert not torch.equal(fx["rpn_labels_ignore"], fx["rpn_labels"])  # the setting changes the choice
