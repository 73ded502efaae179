"""An image smaller than the model's smallest input (SegFormer: 29 px) is named, never a torch error:
a bad sample with its file:line in tools/eval.py and in training's periodic evaluation (the metrics
are those of the other images), a skipped file with one line in tools/infer.py (PyTorch and ONNX
Runtime), an ``ImageReadError`` naming it from the Predictor. The other families take any image their
eval transforms make (tests/inference/test_smallest_inputs.py)."""

from __future__ import annotations

import logging
import os

import cv2
import numpy as np
import pytest
import torch
from ppdist_testing import check_ok, ppdist_log_records, run_tool, tiny_seg_config

from ppdist.components import build_model
from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.eval_runner import evaluate_checkpoint
from ppdist.export.model_export import export_model
from ppdist.registry import SYNTHETIC_DATA
from ppdist.tasks.runner import ImageReadError

SMALL = {"tiny.png": (1, 1), "flat.png": (17, 130)}  # name -> (height, width)
REASON = "smaller than the model's smallest input 29x29"


def write_small_images(data_dir: str) -> None:
    """Two too-small images (and labels) appended to the synthetic val.txt as lines 4 and 5."""
    lines = []
    for name, (height, width) in SMALL.items():
        image = np.full((height, width, 3), 120, np.uint8)
        cv2.imwrite(os.path.join(data_dir, "images", "val", name), image)
        cv2.imwrite(os.path.join(data_dir, "labels", "val", name), np.ones((height, width), np.uint8))
        lines.append(f"images/val/{name} labels/val/{name}\n")
    with open(os.path.join(data_dir, "val.txt"), "a", encoding="utf-8") as handle:
        handle.writelines(lines)


@pytest.fixture(scope="module")
def segformer(tmp_path_factory):
    """(config path, overrides, data dir): a tiny SegFormer evaluated at full size (Normalize only),
    3 synthetic 64x64 val images + the two small ones, random weights in ``ckpt.pt``."""
    root = tmp_path_factory.mktemp("segformer_small")
    data = str(root / "data")
    cfg = tiny_seg_config(str(root / "c.yml"), data, str(root / "out"), model="segformer", max_iters=2)
    SYNTHETIC_DATA.get("seg")(data, num_train=8, num_val=3, seed=7, image_size=64, num_classes=4)
    write_small_images(data)
    ckpt = str(root / "ckpt")
    overrides = [
        "Global.synthetic_data=null",
        f"Global.checkpoints={ckpt}",
        "Eval.dataset.transforms=[{Normalize: {}}]",
        "Eval.loader.batch_size_per_card=1",
    ]
    torch.manual_seed(0)
    torch.save({"model": build_model(load_config(cfg, overrides)).state_dict()}, ckpt + ".pt")
    return cfg, overrides, data


def test_eval_names_the_small_images_and_scores_the_others(segformer):
    cfg, overrides, data = segformer
    with ppdist_log_records(logging.WARNING) as records:
        metrics = evaluate_checkpoint(load_config(cfg, overrides), DistEnv())
    text = "\n".join(r.getMessage() for r in records)
    for line, name in ((4, "tiny.png"), (5, "flat.png")):
        assert f"val.txt:{line} (images/val/{name}): the image is" in text
    assert text.count(REASON) == 2 and "17x130 (HxW) after the transforms" in text
    with open(os.path.join(data, "val.txt"), encoding="utf-8") as handle:
        normal = handle.readlines()[:3]
    with open(os.path.join(data, "val_normal.txt"), "w", encoding="utf-8") as handle:
        handle.writelines(normal)
    expected = evaluate_checkpoint(
        load_config(cfg, overrides + ["Eval.dataset.val_path=val_normal.txt"]), DistEnv()
    )
    assert metrics == expected  # the small images are left out, nothing else changes


def test_periodic_evaluation_in_training_goes_on(segformer, tmp_path):
    cfg, overrides, _ = segformer
    save_dir = str(tmp_path / "run")
    result = check_ok(
        run_tool(
            [
                "train.py",
                "-c",
                cfg,
                "-o",
                *overrides[:1],
                *overrides[2:],
                f"Global.save_model_dir={save_dir}",
                "Global.eval_batch_step=[2,2]",
            ]
        )
    )
    log = result.stdout + result.stderr
    assert log.count(REASON) == 2 and "val.txt:4" in log and "val.txt:5" in log
    assert os.path.isfile(os.path.join(save_dir, "best_accuracy.pt"))


def test_infer_skips_them_with_one_line_each_from_checkpoint_and_onnx(segformer, tmp_path):
    cfg, overrides, data = segformer
    config = load_config(cfg, overrides)
    model_dir = str(tmp_path / "inf")
    export_model(config, model_dir, ("onnx",))
    images = [os.path.join(data, "images", "val", n) for n in ("00000000.jpg", "tiny.png", "flat.png")]
    for source in (["-c", cfg, "-o", *overrides], ["--model", model_dir]):
        out = str(tmp_path / ("pt" if source[0] == "-c" else "ort"))
        folder = tmp_path / "input"
        folder.mkdir(exist_ok=True)
        for path in images:
            if not (folder / os.path.basename(path)).exists():
                os.symlink(path, folder / os.path.basename(path))
        result = check_ok(
            run_tool(["infer.py", *source, "--input", str(folder), "--output_dir", out, "--no_progress"])
        )
        log = result.stdout + result.stderr
        assert log.count(REASON) == 2, log  # one line per skipped image, not two
        assert "1 image(s) predicted, 2 skipped" in log
        assert "1x1 (HxW) after preprocessing" in log and "17x130 (HxW) after preprocessing" in log


def test_the_predictor_names_the_small_image(segformer):
    from ppdist.predict import Predictor

    cfg, overrides, data = segformer
    predictor = Predictor(cfg, overrides=overrides)
    assert predictor([os.path.join(data, "images", "val", "00000000.jpg")])[0]["label_map"].shape == (64, 64)
    with pytest.raises(
        ImageReadError, match=r"tiny.png: the image is 1x1 \(HxW\) after preprocessing, " + REASON
    ):
        predictor([os.path.join(data, "images", "val", "tiny.png")])
