"""A whole Cascade R-CNN R50-FPN in eval mode (the release config, converted) gives
PaddleDetection's detections for the same weights and input: ``eval_bbox`` / ``eval_bbox_num`` of
tests/fixtures/paddle_step/cascade_rcnn.npz, written by make_cascade_rcnn.py with PaddleDetection
release/2.7.1's own model (three stages, the stages' mean score, the last stage's boxes) and
BBoxPostProcess (paddlepaddle 2.6.2), every stage's classifier and regressor spread so that there
are detections. Two padded images with different scale factors, 100 detections each."""

import os

import torch
from faster_rcnn_testing import CASCADE_R50_FPN, same_detections
from paddle_step_harness import fixture_script
from paddle_step_testing import load_arrays, to_torch

from ppdist.components import build_postprocess
from ppdist.convert.configs.convert import convert_config
from ppdist.modeling.architectures import BaseModel

MAKE = fixture_script("make_cascade_rcnn.py")


def test_whole_model_detections_equal_paddledetections():
    fixture = load_arrays(os.path.join(MAKE.HERE, "cascade_rcnn.npz"))
    config = convert_config(CASCADE_R50_FPN).config
    model = BaseModel(config["Architecture"])
    model.load_state_dict(to_torch(model, MAKE.eval_state()))
    model.eval()
    batch = {
        "image": torch.from_numpy(MAKE.images()),
        "im_shape": torch.tensor(MAKE.IM_SHAPES),
        "scale_factor": torch.tensor(MAKE.SCALE_FACTORS),
        "im_id": torch.tensor([[0], [1]]),
    }
    with torch.no_grad():
        results = build_postprocess(config)(model(batch), batch)
    assert fixture["eval_bbox_num"].tolist() == [100, 100]
    scores, boxes = same_detections(results, fixture["eval_bbox"], fixture["eval_bbox_num"])
    print(f"scores within {scores:.1e}, boxes within {boxes:.1e} px")
