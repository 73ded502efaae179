"""Res5Head (the C4 Faster R-CNN's RoI head) equals PaddleDetection's: output for the same weights
and RoI features, trainable parameters (its norms frozen), weight names. Fixture res5_head.npz by
tests/fixtures/faster_rcnn/make_backbone.py (paddlepaddle 2.6.2); measured max abs error 4.8e-6
on outputs up to 4.8."""

import importlib.util
import json
import os

import numpy as np
import pytest
import torch

from ppdist.convert.weights import convert_state_dict
from ppdist.errors import ConfigError
from ppdist.modeling.heads.res5_head import Res5Head

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "faster_rcnn")
_spec = importlib.util.spec_from_file_location("make_backbone", os.path.join(FIXTURES, "make_backbone.py"))
FX = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(FX)


def test_res5_head_equals_paddledetection():
    with np.load(os.path.join(FIXTURES, "res5_head.npz")) as data:
        arrays = {key: data[key] for key in data.files}
    meta = json.loads(str(arrays["meta"]))
    head = Res5Head(depth=50, in_channel=1024, resolution=14)
    shapes = dict(zip(meta["keys"], [tuple(s) for s in meta["shapes"]]))
    state, report = convert_state_dict(head, FX.synthetic_state(shapes), "fixture")
    assert report.complete and not report.unused, report.lines()
    head.load_state_dict(state)
    assert {n for n, p in head.named_parameters() if p.requires_grad} == set(meta["trainable"])
    x = torch.from_numpy(arrays["roi_feat"])
    for mode in (False, True):  # frozen norms: training mode computes the same
        head.train(mode)
        with torch.no_grad():
            np.testing.assert_allclose(head(x).numpy(), arrays["out"], rtol=0, atol=1e-4)
    assert head.out_channels == 2048


def test_res5_head_refuses_other_input_widths():
    with pytest.raises(ConfigError, match="1024-channel"):
        Res5Head(depth=50, in_channel=256)
    assert Res5Head(depth=34, in_channel=256).out_channels == 512
