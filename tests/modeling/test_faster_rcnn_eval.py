"""A whole Faster R-CNN R50-vd FPN in eval mode (the release config, converted) gives
PaddleDetection's detections for the same weights and input: tests/fixtures/faster_rcnn/eval.npz,
written by make_eval.py beside it with PaddleDetection release/2.7.1's own model and
BBoxPostProcess (paddlepaddle 2.6.2), on the step fixture's seeded weights with the box head
spread. Two padded images with different scale factors, 100 detections each (keep_top_k cuts).
Measured: labels and counts exact, scores within 1.7e-6, boxes within 4.6e-5 px."""

import importlib.util
import os

import numpy as np
import torch
from faster_rcnn_testing import R50_VD_FPN, same_detections
from paddle_step_testing import to_torch

from ppdist.components import build_postprocess
from ppdist.convert.configs.convert import convert_config
from ppdist.modeling.architectures import BaseModel

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "faster_rcnn")
CONFIG = R50_VD_FPN


def make_eval():
    spec = importlib.util.spec_from_file_location("make_eval", os.path.join(FIXTURES, "make_eval.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_whole_model_detections_equal_paddledetections():
    fixture = dict(np.load(os.path.join(FIXTURES, "eval.npz")))
    script = make_eval()
    make = script.step_script()
    config = convert_config(CONFIG).config
    model = BaseModel(config["Architecture"])
    model.load_state_dict(to_torch(model, script.eval_state(make)))
    model.eval()
    batch = {
        "image": torch.from_numpy(make.images()),
        "im_shape": torch.tensor(make.IM_SHAPES),
        "scale_factor": torch.tensor(script.SCALE_FACTORS),
        "im_id": torch.tensor([[0], [1]]),
    }
    with torch.no_grad():
        results = build_postprocess(config)(model(batch), batch)
    assert fixture["bbox_num"].tolist() == [100, 100]
    same_detections(results, fixture["bbox"], fixture["bbox_num"])
