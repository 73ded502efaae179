"""RPNHead, AnchorGenerator and ProposalGenerator against PaddleDetection's own RPNHead.

The fixture (tests/fixtures/faster_rcnn/rpn.npz, written by make_rpn.py beside it with
paddlepaddle 2.6.2 and PaddleDetection release/2.7.1) holds random weights and FPN features for a
2-image batch (image shapes 64 x 96 and 50 x 70), the original's anchors, score / delta maps and
proposals of an eval and a training setting (topk_after_collect). The anchors must be equal, the
maps within 1e-4, the proposals the same boxes in the same order with the same counts: within 1e-4
from the original's maps, within 1e-4 + 1e-5 relative from ppdist's own maps (the convolutions'
rounding, ~1e-6 on a delta, is multiplied by anchor sides up to 512 px: measured 1.4e-4 on a
28 px coordinate). The weights go through ppdist's Paddle weights converter by their Paddle names
(``rpn_head.rpn_feat.rpn_conv.weight``, ...): nothing missing, skipped or unused.
"""

import os

import numpy as np
import pytest
import torch
from faster_rcnn_testing import RPN_ANCHORS, RPN_STRIDES, RPN_TEST, RPN_TRAIN
from torch import nn

from ppdist.convert.weights import convert_state_dict
from ppdist.errors import ConfigError
from ppdist.modeling.heads.anchor_generator import AnchorGenerator
from ppdist.modeling.heads.proposal_generator import ProposalGenerator
from ppdist.modeling.heads.rpn_head import RPNHead
from ppdist.registry import HEADS
from ppdist.utils.host_sync import HostSyncCounter

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "faster_rcnn", "rpn.npz")
STRIDES, ANCHORS, TRAIN, TEST = RPN_STRIDES, RPN_ANCHORS, RPN_TRAIN, RPN_TEST  # the fixture's settings


@pytest.fixture(scope="module")
def data():
    return dict(np.load(FIXTURE))


def build_head(data) -> RPNHead:
    head = HEADS.build(
        {
            "name": "RPNHead",
            "anchor_generator": ANCHORS,
            "train_proposal": TRAIN,
            "test_proposal": TEST,
            "in_channel": 8,
        }
    )
    # through the weights converter, by Paddle's names (``rpn_head.rpn_feat.rpn_conv.weight``, ...)
    model = nn.Module()
    model.rpn_head = head
    paddle_state = {f"rpn_head.{k[2:]}": v for k, v in data.items() if k.startswith("w:")}
    state, report = convert_state_dict(model, paddle_state, "rpn.npz")
    assert not report.missing and not report.skipped and not report.unused, report.lines()
    model.load_state_dict(state)
    return head


def feats(data):
    return [torch.from_numpy(data[f"feat{i}"]) for i in range(len(STRIDES))]


def padded_to_list(rois: torch.Tensor, mask: torch.Tensor):
    counts = mask.sum(1).tolist()
    assert all(bool(m[:c].all()) and not bool(m[c:].any()) for m, c in zip(mask, counts)), (
        "valid ones come first"
    )
    return [r[:c] for r, c in zip(rois, counts)], counts


def test_anchors_equal_paddle(data):
    anchors = AnchorGenerator(**ANCHORS)(feats(data))
    for level, got in enumerate(anchors):
        np.testing.assert_array_equal(got.numpy(), data[f"anchor{level}"])


def test_head_maps_match_paddle(data):
    head = build_head(data).eval()
    with torch.no_grad():
        rpn_feats = head.rpn_feat(feats(data))
        for level, feat in enumerate(rpn_feats):
            np.testing.assert_allclose(
                head.rpn_rois_score(feat).numpy(), data[f"score{level}"], atol=1e-4, rtol=0
            )
            np.testing.assert_allclose(
                head.rpn_rois_delta(feat).numpy(), data[f"delta{level}"], atol=1e-4, rtol=0
            )


@pytest.mark.parametrize("mode", ["test", "train"])
def test_proposals_match_paddle(data, mode):
    """The same proposals in the same order, from the head's own maps (eval: each level keeps 60,
    the collection 60; training: each level keeps 120 after NMS, the collection 80)."""
    head = build_head(data)
    head.train(mode == "train")
    with torch.no_grad():
        out = head(feats(data), torch.from_numpy(data["im_shape"]))
    got, counts = padded_to_list(out["rois"], out["rois_mask"])
    expected = np.split(data[f"{mode}_rois"], np.cumsum(data[f"{mode}_num"])[:-1])
    assert counts == data[f"{mode}_num"].tolist()
    for mine, theirs in zip(got, expected):
        np.testing.assert_allclose(mine.numpy(), theirs, atol=1e-4, rtol=1e-5)


def test_proposals_from_paddle_maps(data):
    """Fed the original's maps and anchors, the generator gives its proposals (no error carried over
    from the convolutions)."""
    scores = [torch.from_numpy(data[f"score{i}"]) for i in range(5)]
    deltas = [torch.from_numpy(data[f"delta{i}"]) for i in range(5)]
    anchors = [torch.from_numpy(data[f"anchor{i}"]) for i in range(5)]
    out = ProposalGenerator(**TEST)(scores, deltas, anchors, torch.from_numpy(data["im_shape"]))
    got, counts = padded_to_list(out["rois"], out["rois_mask"])
    assert counts == data["test_num"].tolist()
    np.testing.assert_allclose(torch.cat(got).numpy(), data["test_rois"], atol=1e-4, rtol=0)


def test_outputs_for_the_loss(data):
    """Training outputs: logits and deltas for every anchor, in the anchors' order, with gradients."""
    head = build_head(data).train()
    out = head(feats(data), torch.from_numpy(data["im_shape"]))
    total = sum(data[f"anchor{i}"].shape[0] for i in range(5))
    assert out["anchors"].shape == (total, 4)
    assert out["rpn_scores"].shape == (2, total) and out["rpn_deltas"].shape == (2, total, 4)
    # anchor a at location (y, x) of level 0: channel a of the score map
    a, y, x = 2, 3, 5
    width = data["score0"].shape[3]
    index = (y * width + x) * 3 + a
    np.testing.assert_allclose(out["rpn_scores"][1, index].item(), data["score0"][1, a, y, x], atol=1e-4)
    np.testing.assert_allclose(
        out["rpn_deltas"][1, index].detach().numpy(), data["delta0"][1, 4 * a : 4 * a + 4, y, x], atol=1e-4
    )
    assert out["rpn_scores"].requires_grad and not out["rois"].requires_grad


def test_proposal_host_reads_are_the_nms_only(data):
    """A training-mode forward reads on the host only inside the NMS: the group sizes and one
    value per suppression round (no count, no boolean indexing)."""
    head = build_head(data).train()
    x, im_shape = feats(data), torch.from_numpy(data["im_shape"])
    with HostSyncCounter() as counter:
        head(x, im_shape)
    where = counter.summary()
    assert counter.count <= 8, counter.report()
    assert all("nms" in what for what in where), counter.report()


def test_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match="eta"):
        ProposalGenerator(eta=0.9)
    with pytest.raises(ValueError, match="strides"):
        AnchorGenerator(anchor_sizes=[[32], [64]], strides=[4, 8, 16])


def test_autocast_keeps_proposals_in_float32(data):
    """Under bf16 autocast the maps are bf16, the anchors and proposals float32 (and valid boxes)."""
    head = build_head(data).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(feats(data), torch.from_numpy(data["im_shape"]))
    assert out["rpn_scores"].dtype == torch.bfloat16
    assert out["anchors"].dtype == out["rois"].dtype == torch.float32
    rois = out["rois"][out["rois_mask"]]
    assert rois.shape[0] > 0 and bool(((rois[:, 2:] - rois[:, :2]) >= 1.0).all())


def test_placeholder_proposals_when_nothing_survives(data):
    """An image 0.5 px high keeps no box past the 1 px floor: Paddle answers one (0, 0, 0, 0)
    proposal of logit 0 per level (5), which the collection keeps; the other image is unchanged."""
    scores = [torch.from_numpy(data[f"score{i}"]) for i in range(5)]
    deltas = [torch.from_numpy(data[f"delta{i}"]) for i in range(5)]
    anchors = [torch.from_numpy(data[f"anchor{i}"]) for i in range(5)]
    out = ProposalGenerator(**TEST)(scores, deltas, anchors, torch.from_numpy(data["tiny_im_shape"]))
    got, counts = padded_to_list(out["rois"], out["rois_mask"])
    assert counts == data["tiny_num"].tolist() == [5, 55]
    np.testing.assert_allclose(torch.cat(got).numpy(), data["tiny_rois"], atol=1e-4, rtol=0)
    assert out["rois_score"][0, :5].tolist() == [0.0] * 5


def test_unknown_nested_settings_name_their_path():
    with pytest.raises(
        ConfigError, match=r"RPNHead.train_proposal.post_nms_topn is not a ProposalGenerator setting"
    ):
        HEADS.build({"name": "RPNHead", "train_proposal": {"post_nms_topn": 10}})
    with pytest.raises(
        ConfigError, match=r"anchor_generator.anchor_size is not .* Did you mean: 'anchor_sizes'"
    ):
        HEADS.build({"name": "RPNHead", "anchor_generator": {"anchor_size": [32]}})
    with pytest.raises(ConfigError, match=r"BBoxHead.roi_extractor.resolutions is not a RoIAlign setting"):
        HEADS.build({"name": "BBoxHead", "roi_extractor": {"resolutions": 7}})
