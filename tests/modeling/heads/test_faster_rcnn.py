"""FasterRCNNHead: Faster R-CNN as Backbone -> Neck -> Head of BaseModel. Built from the converted
release configs, the whole model has PaddleDetection's trainable parameter count
(tests/fixtures/faster_rcnn/param_counts.json, counted by PaddleDetection's own model); eval gives
what BBoxPostProcess reads; training samples the proposals between the two stages.

Needs the registered RPNHead and BBoxHead (ppdist/modeling/heads/rpn_head.py, bbox_head.py)."""

import json
import os

import numpy as np
import pytest
import torch
from faster_rcnn_testing import tiny_faster_rcnn
from torch import nn

import ppdist.components  # noqa: F401  (registers every component)
from ppdist.convert.configs.convert import convert_config
from ppdist.convert.weights import convert_state_dict
from ppdist.errors import ConfigError
from ppdist.modeling.architectures import BaseModel
from ppdist.registry import HEADS

pytestmark = pytest.mark.skipif(
    "RPNHead" not in HEADS or "BBoxHead" not in HEADS,
    reason="needs the Faster R-CNN heads (RPNHead, BBoxHead)",
)
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CONFIGS = os.path.join(
    REPO, "tests", "fixtures", "paddle_configs", "PaddleDetection", "configs", "faster_rcnn"
)
FIXTURES = os.path.join(REPO, "tests", "fixtures", "faster_rcnn")
with open(os.path.join(FIXTURES, "param_counts.json"), encoding="utf-8") as f:
    COUNTS = json.load(f)


def trainable(module):
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    "name",
    [
        "faster_rcnn_r34_fpn_1x_coco.yml",
        "faster_rcnn_r50_vd_fpn_ssld_1x_coco.yml",
        "faster_rcnn_r101_vd_fpn_2x_coco.yml",
        "faster_rcnn_x101_vd_64x4d_fpn_1x_coco.yml",
        "faster_rcnn_r50_vd_1x_coco.yml",  # C4: Res5Head
        "faster_rcnn_r101_1x_coco.yml",
    ],
)
def test_whole_model_has_paddledetections_trainable_parameters(name):
    model = BaseModel(convert_config(os.path.join(CONFIGS, name)).config["Architecture"])
    assert trainable(model) == COUNTS[name]["total"]
    assert trainable(model.head.rpn_head) == COUNTS[name]["rpn_head"]
    assert trainable(model.head.bbox_head) == COUNTS[name]["bbox_head"]


@pytest.mark.parametrize(
    "name", ["faster_rcnn_r50_vd_fpn_1x_coco.yml", "faster_rcnn_x101_vd_64x4d_fpn_1x_coco.yml"]
)
def test_a_model_zoo_state_dict_converts_whole(name):
    """Every tensor of PaddleDetection's model (keys and shapes in model_keys.json, by
    make_model_keys.py) has its place in ppdist's, and every ppdist tensor is found."""
    with open(os.path.join(FIXTURES, "model_keys.json"), encoding="utf-8") as handle:
        shapes = json.load(handle)[name]
    paddle_state = {key: np.zeros(shape, dtype=np.float32) for key, shape in shapes.items()}
    model = BaseModel(convert_config(os.path.join(CONFIGS, name)).config["Architecture"])
    state, report = convert_state_dict(model, paddle_state, name)
    assert report.complete and not report.unused and not report.skipped, report.lines()
    model.load_state_dict(state)


def test_eval_gives_the_post_process_inputs_and_a_bare_tensor_the_same():
    torch.manual_seed(0)
    model = BaseModel(tiny_faster_rcnn()).eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        out = model({"image": x, "im_shape": torch.tensor([[64.0, 96.0], [64.0, 96.0]])})
        bare = model(x)
    assert out["rois"].shape == (2, 40, 4) and out["bbox_prob"].shape == (2, 40, 4)
    assert out["bbox_delta"].shape == (2, 40, 12) and out["rpn_rois"].shape == (2, 40, 4)
    assert {"rpn_scores", "rpn_deltas", "anchors", "rois_mask"} <= set(out)
    for key in out:
        torch.testing.assert_close(bare[key], out[key], rtol=0, atol=0)


class FirstRoIs(nn.Module):
    """A stand-in sampler: the first 8 proposals of each image and a label per RoI."""

    def __init__(self):
        super().__init__()
        self.seen = None

    def forward(self, rois, rois_mask, batch):
        self.seen = (rois, batch)
        return {"rois": rois[:, :8], "rois_mask": rois_mask[:, :8], "labels": torch.zeros(rois.shape[0], 8)}


def test_training_samples_the_proposals_between_the_stages():
    torch.manual_seed(0)
    model = BaseModel(tiny_faster_rcnn()).train()
    model.head.bbox_assigner = FirstRoIs()
    batch = {"image": torch.randn(2, 3, 64, 96), "im_shape": torch.tensor([[64.0, 96.0], [60.0, 90.0]])}
    out = model(batch)
    rois, seen_batch = model.head.bbox_assigner.seen
    assert not rois.requires_grad and seen_batch is batch and rois.shape == (2, 50, 4)
    assert out["rois"].shape == (2, 8, 4) and out["bbox_score"].shape == (2, 8, 4) and "labels" in out
    torch.testing.assert_close(out["rois"], out["rpn_rois"][:, :8], rtol=0, atol=0)
    out["bbox_score"].sum().backward()
    assert model.backbone.res5.res5a.branch2a.conv.weight.grad is not None


def test_training_without_a_registered_sampler_is_one_line():
    arch = tiny_faster_rcnn()
    arch["Head"]["bbox_head"]["bbox_assigner"] = {"name": "NoSuchAssigner"}
    model = BaseModel(arch).train()
    with pytest.raises(ConfigError, match="bbox_assigner 'NoSuchAssigner'"):
        model({"image": torch.randn(1, 3, 64, 64), "im_shape": torch.tensor([[64.0, 64.0]])})


def test_the_box_sampler_counts_the_box_heads_classes_unless_told():
    """PaddleDetection injects one global num_classes into BBoxHead and BBoxAssigner; an assigner
    entry without its own takes the box head's (a mismatch would give out-of-range labels)."""
    arch = tiny_faster_rcnn()
    del arch["Head"]["bbox_head"]["bbox_assigner"]["num_classes"]
    model = BaseModel(arch)
    assert model.head.bbox_head.num_classes == 3 and model.head.bbox_assigner.num_classes == 3
    arch["Head"]["bbox_head"]["bbox_assigner"]["num_classes"] = 5
    assert BaseModel(arch).head.bbox_assigner.num_classes == 5
