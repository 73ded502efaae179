"""SegPostProcess's test-time options equal PaddleSeg's ``paddleseg/core/infer.py``.

The fixture (tests/fixtures/paddle_seg/make_slide_fixture.py, paddlepaddle 2.6.2) holds the
logits of PaddleSeg's own ``slide_inference`` / ``aug_inference`` on the small PP-LiteSeg of
make_fixtures.py (its .pdparams) for a 1x3x70x110 image: sliding windows of 48x40 every 32x24
(the last ones moved back to the border, overlaps averaged), scales [0.75, 1.0, 1.25] with
horizontal and vertical flips, both together, and logits resized back to a label of another size
(PaddleSeg's ``trans_info``). Measured max abs differences of the logits (torch CPU, ``pytest -s``
prints them): 2.6e-6 to 1.2e-5; the predicted labels are identical.
"""

import importlib.util
import os

import numpy as np
import pytest
import torch
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir, paddle_fixture_script

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.convert.weights import load_paddle_weights
from ppdist.postprocess.seg import SegPostProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "seg", "pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml")
SMALL = "pp_liteseg_stdc1_small"
FIXTURE = paddle_fixture_arrays("seg", f"{SMALL}_test_time")


def _load_cases():
    """``CASES`` of the fixture's script: the PaddleSeg ``test_config`` of each stored result."""
    path = os.path.join(paddle_fixture_dir("seg"), "make_slide_fixture.py")
    spec = importlib.util.spec_from_file_location("paddle_seg_slide_fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


CASES = _load_cases()


def _flow(values):
    return "[" + ", ".join(str(v) for v in values) + "]"


@pytest.fixture(scope="module")
def model():
    settings = paddle_fixture_script("seg").FIXTURES[SMALL]
    opts = [f"Global.num_classes={settings['num_classes']}"]
    opts += [f"Architecture.Backbone.{k}={v}" for k, v in settings["Backbone"].items() if k != "name"]
    opts += [
        f"Architecture.Head.{k}={_flow(v) if isinstance(v, list) else v}" for k, v in settings["Head"].items()
    ]
    net = build_model(load_config(CONFIG, opts))
    state, report = load_paddle_weights(net, os.path.join(paddle_fixture_dir("seg"), f"{SMALL}.pdparams"))
    assert report.complete
    net.load_state_dict(state, strict=True)
    return net.eval()


@pytest.mark.parametrize("case", sorted(CASES))
def test_test_time_logits_and_labels_equal_paddleseg(model, case):
    options = dict(CASES[case])
    ori_shape = options.pop("ori_shape", None)
    post = SegPostProcess(**options)
    image = torch.from_numpy(FIXTURE["image"])
    batch = {"image": image}
    if ori_shape is not None:
        batch["label"] = torch.zeros([1] + ori_shape, dtype=torch.int64)
    with torch.no_grad():
        preds = post.infer(model, batch)
        logits = post.logits_at_label_size(preds, batch).numpy()
        labels = post(preds, batch).numpy()
    expected = FIXTURE[f"logits/{case}"]
    assert logits.shape == expected.shape
    diff = float(np.abs(logits - expected).max())
    print(f"{case}: max abs diff of the logits {diff:.2e}")
    assert diff <= 1e-4
    assert np.array_equal(labels, FIXTURE[f"pred/{case}"].astype(np.int64))
