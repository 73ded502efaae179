"""Evaluation pictures of untrained models on quick-start-style synthetic data, through the
evaluator as tools/eval.py runs it: the detection PR curves are an independent pycocotools
evaluation's precision array and the box confusion matrix counts every box once; the segmentation
confusion matrix holds the metric's intersections and every evaluated pixel."""

import contextlib
import io
import json
import os

import numpy as np
import torch
from picture_testing import assert_picture
from PIL import Image
from ppdist_testing import tiny_det_config, tiny_seg_config
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from ppdist.components import build_metric, build_model, build_postprocess
from ppdist.config import load_config
from ppdist.data.build import build_dataloader
from ppdist.data.synthetic_det import generate_det_dataset
from ppdist.data.synthetic_seg import generate_seg_dataset
from ppdist.engine.dist import DistEnv
from ppdist.engine.evaluator import Evaluator
from ppdist.visualize.eval_pictures import pr_curves


def evaluate(config, model):
    """The evaluator of ``config``'s Eval set after one run of ``model``."""
    loader = build_dataloader(config, "Eval", "eval", 0, 1, "cpu")
    evaluator = Evaluator(loader, build_postprocess(config), build_metric(config), DistEnv())
    evaluator.run(model)
    return evaluator


def test_detection_pictures_of_an_untrained_detector(tmp_path):
    data = str(tmp_path / "data")
    generate_det_dataset(data, num_train=1, num_val=6, seed=5, image_size=96, num_classes=2, max_objects=3)
    cfg = tiny_det_config(str(tmp_path / "det.yml"), data, str(tmp_path / "run"))
    overrides = ["Global.synthetic_data=null", "PostProcess.score_threshold=0.0", "PostProcess.keep_top_k=20"]
    config = load_config(cfg, overrides + ["Metric.confusion_score=0.5"])
    torch.manual_seed(0)
    model = build_model(config)
    for layer in model.head.pred_cls:  # spread the untrained scores over 0..1
        torch.nn.init.normal_(layer.weight, std=0.05)
        torch.nn.init.normal_(layer.bias, std=1.0)
    evaluator = evaluate(config, model)
    written = evaluator.draw_pictures(str(tmp_path / "out"))
    names = ["bbox.json", "class_ap.md", "confusion_matrix.png", "pr_curves.png"]
    assert sorted(os.path.basename(p) for p in written) == names[1:]
    metric, table = evaluator.metric, evaluator.metric.detections
    assert len(table) == 6 * 20
    with contextlib.redirect_stdout(io.StringIO()):  # an independent evaluation of the same boxes
        gt = COCO(metric.anno_file)
        dt = gt.loadRes(
            [
                {"image_id": int(r[0]), "bbox": r[1:5].tolist(), "score": r[5], "category_id": int(r[6])}
                for r in table
            ]
        )
        reference = COCOeval(gt, dt, "bbox")
        reference.evaluate()
        reference.accumulate()
    curves = pr_curves(
        metric.last_eval["precision"],
        metric.last_eval["recall_thresholds"],
        metric.label_list,
        str(tmp_path / "pr.png"),
    )
    for k, name in enumerate(metric.label_list):
        np.testing.assert_array_equal(
            curves[f"{name} (IoU 0.5)"], reference.eval["precision"][0, :, k, 0, -1]
        )
    annotations = json.load(open(metric.anno_file))["annotations"]
    kept = int((table[:, 5] >= 0.5).sum())
    assert (metric.confusion_iou, metric.confusion_score) == (0.5, 0.5)  # the default, and the config
    matrix = metric.confusion(0.5, 0.5)  # the drawn matrix
    assert 0 < kept < len(table) and matrix.shape == (3, 3)
    assert matrix[:2].sum() == len(annotations)  # each ground-truth box once (matched or missed)
    assert matrix[:, :2].sum() == kept  # each kept prediction once (matched or background)
    assert matrix.sum() == len(annotations) + matrix[2].sum() and matrix[2, 2] == 0
    for name in ("pr_curves.png", "confusion_matrix.png"):
        assert_picture(str(tmp_path / "out" / name))


def test_segmentation_pictures_of_an_untrained_model(tmp_path):
    data = str(tmp_path / "data")
    generate_seg_dataset(data, num_train=1, num_val=5, seed=3, image_size=64, num_classes=4)
    cfg = tiny_seg_config(str(tmp_path / "seg.yml"), data, str(tmp_path / "run"))
    config = load_config(cfg, ["Global.synthetic_data=null"])
    torch.manual_seed(0)
    evaluator = evaluate(config, build_model(config))
    metric = evaluator.metric
    labels = np.stack(
        [np.asarray(Image.open(os.path.join(data, "labels", "val", f"{i:08d}.png"))) for i in range(5)]
    )
    assert np.diag(metric.confusion).tolist() == metric.areas[0].tolist()  # the metric's intersections
    assert metric.confusion.sum() == int((labels != 255).sum()) > 0  # every evaluated pixel once
    assert metric.confusion.sum(axis=1).tolist() == np.bincount(labels[labels != 255], minlength=4).tolist()
    written = evaluator.draw_pictures(str(tmp_path / "out"))
    assert [os.path.basename(p) for p in written] == ["confusion_matrix.png", "class_iou.png"]
    for path in written:
        assert_picture(path)
