"""Every family's smallest input, checked the same way: images of 1x1, 3x200 and 200x3 pixels go
through each recipe's inference preprocess and model (random weights, PyTorch) and come out as
results or as an ``ImageReadError`` naming the image and why (SegFormer: under its smallest input;
SLANet: too flat to resize), never as an error from inside torch (tests/test_smallest_input.py covers eval, training and ONNX for it)."""

from __future__ import annotations

import os

import cv2
import numpy as np
import pytest
import torch
from ppdist_testing import REPO, tiny_config, tiny_det_config, tiny_seg_config, tiny_table_config

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.modeling.input_size import min_input_size
from ppdist.predict import Predictor
from ppdist.tasks.runner import ImageReadError

SIZES = [(1, 1), (3, 200), (200, 3)]
FULL_SIZE_EVAL = "Eval.dataset.transforms=[{Normalize: {}}]"  # segmentation at the image's own size


def recipe(family: str, tmp_path) -> tuple:
    """(config path, overrides) of a small model of ``family`` (no data needed for inference)."""
    data, out, cfg = str(tmp_path / "data"), str(tmp_path / "out"), str(tmp_path / "c.yml")
    os.makedirs(data)
    with open(os.path.join(data, "dict.txt"), "w", encoding="utf-8") as handle:
        handle.write("".join(f"{c}\n" for c in "0123456789"))
    if family == "crnn":
        return tiny_config(cfg, data, out), [f"Global.character_dict_path={data}/dict.txt"]
    if family == "ppocrv3":
        return os.path.join(REPO, "configs", "rec", "PP-OCRv3", "ch_PP-OCRv3_rec_distillation.yml"), []
    if family == "slanet":
        return tiny_table_config(cfg, data, out), []
    if family == "ppyoloe":
        return tiny_det_config(cfg, data, out), []
    model = {"pp_liteseg": "pp_liteseg", "ocrnet": "ocrnet", "segformer": "segformer"}[family]
    return tiny_seg_config(cfg, data, out, model=model), [FULL_SIZE_EVAL]


@pytest.mark.parametrize(
    "family", ["crnn", "ppocrv3", "slanet", "ppyoloe", "pp_liteseg", "ocrnet", "segformer"]
)
def test_tiny_images_give_results_or_a_named_error(family, tmp_path):
    cfg, overrides = recipe(family, tmp_path)
    ckpt = str(tmp_path / "ckpt")
    overrides = ["Global.synthetic_data=null", f"Global.checkpoints={ckpt}", *overrides]
    torch.manual_seed(0)
    model = build_model(load_config(cfg, overrides))
    torch.save({"model": model.state_dict()}, ckpt + ".pt")
    smallest = min_input_size(model)
    predictor = Predictor(cfg, overrides=overrides)
    named_errors = []
    for height, width in SIZES:
        path = str(tmp_path / f"img_{height}x{width}.png")
        cv2.imwrite(path, np.full((height, width, 3), 90, np.uint8))
        try:
            (result,) = predictor([path])
        except ImageReadError as exc:  # named, and the next image goes on (tools/infer.py skips it)
            assert str(exc).startswith(f"{path}: ")
            named_errors.append(str(exc))
        else:
            assert result["path"] == path
    if smallest is not None:
        assert len(named_errors) == 3 and all(
            "smaller than the model's smallest input" in e for e in named_errors
        )
    assert (smallest is not None) == (family == "segformer")
    # SLANet: 3x200 and 200x3 would be 0 pixels on one side at its 64-pixel longest side (named, as before)
    assert len(named_errors) == {"segformer": 3, "slanet": 2}.get(family, 0), named_errors
