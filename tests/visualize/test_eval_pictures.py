"""Evaluation pictures: PR curves are COCOeval's precision array, confusion matrices count what was
evaluated, the recognition gallery shows the worst mistakes; tools/eval.py --output_dir and the
final evaluation of a training write them."""

import contextlib
import io
import json
import os
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from picture_testing import assert_picture, keep_saved_figures
from PIL import Image
from ppdist_testing import check_ok, run_tool, tiny_config, tiny_run_config
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from rapidfuzz.distance import Levenshtein

from ppdist.data.base import SAMPLE_INDEX_KEY
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer
from ppdist.metrics.coco import COCOMetric, class_average_precision, coco_bbox_eval, load_ground_truth
from ppdist.metrics.det_confusion import detection_confusion
from ppdist.metrics.rec import GALLERY_SIZE, RecMetric
from ppdist.metrics.report import dataset_image
from ppdist.metrics.seg import SegMetric
from ppdist.visualize import eval_pictures
from ppdist.visualize.eval_pictures import confusion_picture, pr_curves, write_report


def coco_case(tmp_path, seed=0):
    """A small COCO ground truth (3 classes, 12 images) and noisy detections of it."""
    rng = np.random.default_rng(seed)
    images, annotations, detections = [], [], []
    for image_id in range(1, 13):
        images.append({"id": image_id, "width": 100, "height": 100, "file_name": f"{image_id}.png"})
        for _ in range(rng.integers(1, 4)):
            x, y, w, h = rng.uniform(0, 60, 2).tolist() + rng.uniform(10, 40, 2).tolist()
            category = int(rng.integers(1, 4))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category,
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
            jitter = rng.normal(0, 3, 4)
            guess = category if rng.random() > 0.2 else int(rng.integers(1, 4))
            detections.append(
                [image_id, x + jitter[0], y + jitter[1], w + jitter[2], h + jitter[3], rng.random(), guess]
            )
        detections.append(
            [image_id, *rng.uniform(0, 60, 2), 20, 20, rng.random() * 0.5, int(rng.integers(1, 4))]
        )
    path = tmp_path / "gt.json"
    categories = [{"id": i, "name": n} for i, n in ((1, "ellipse"), (2, "rectangle"), (3, "ring"))]
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(path))
    return gt, np.array(detections, dtype=np.float64), annotations


def test_pr_curves_are_cocoevals_precision_array(tmp_path):
    gt, table, _ = coco_case(tmp_path)
    keep = {}
    coco_bbox_eval(gt, table, list(range(1, 13)), keep=keep)
    with contextlib.redirect_stdout(io.StringIO()):  # an independent pycocotools evaluation
        dt = gt.loadRes(
            [
                {"image_id": int(r[0]), "bbox": r[1:5].tolist(), "score": r[5], "category_id": int(r[6])}
                for r in table
            ]
        )
        reference = COCOeval(gt, dt, "bbox")
        reference.evaluate()
        reference.accumulate()
    np.testing.assert_array_equal(keep["precision"], reference.eval["precision"])
    curves = pr_curves(
        keep["precision"],
        keep["recall_thresholds"],
        ["ellipse", "rectangle", "ring"],
        str(tmp_path / "pr.png"),
    )
    for k, name in enumerate(["ellipse", "rectangle", "ring"]):
        np.testing.assert_array_equal(
            curves[f"{name} (IoU 0.5)"], reference.eval["precision"][0, :, k, 0, -1]
        )
    at_50 = reference.eval["precision"][0, :, :, 0, -1]
    np.testing.assert_allclose(
        curves["all classes (IoU 0.5)"], at_50.mean(axis=1)
    )  # every class defined here
    every_iou = reference.eval["precision"][:, :, :, 0, -1]  # [T, R, K]
    np.testing.assert_allclose(curves["all classes (IoU 0.5:0.95)"], every_iou.mean(axis=(0, 2)))
    assert class_average_precision(keep["precision"]) == pytest.approx(
        [reference.eval["precision"][:, :, k, 0, -1].mean() for k in range(3)]
    )
    assert_picture(str(tmp_path / "pr.png"), min_size=(900, 600))


@pytest.fixture
def drawn_figures(monkeypatch):
    """The figures the evaluation pictures save, kept for inspection (and still written)."""
    return keep_saved_figures(monkeypatch, eval_pictures)


def test_the_two_all_classes_pr_curves_are_told_apart(tmp_path, drawn_figures):
    gt, table, _ = coco_case(tmp_path)
    keep = {}
    coco_bbox_eval(gt, table, list(range(1, 13)), keep=keep)
    pr_curves(
        keep["precision"],
        keep["recall_thresholds"],
        ["ellipse", "rectangle", "ring"],
        str(tmp_path / "pr.png"),
    )
    lines = {line.get_label().rsplit(": ", 1)[0]: line for line in drawn_figures[0].axes[0].get_lines()}
    assert lines["all classes (IoU 0.5)"].get_linestyle() == "-"
    assert lines["all classes (IoU 0.5:0.95)"].get_linestyle() == "--"
    assert lines["all classes (IoU 0.5:0.95)"].get_label().startswith("all classes (IoU 0.5:0.95): AP 0.")


def test_confusion_colours_are_shares_of_the_row_and_cells_show_counts(tmp_path, drawn_figures):
    """A large row (detection's background) does not wash out the others: each cell is coloured by
    its share of its row, on a fixed 0..1 scale, and labelled with its count."""
    matrix = np.array([[3, 1, 0], [0, 2, 2], [0, 40, 360]])
    shares = confusion_picture(matrix, ["a", "b", "background"], str(tmp_path / "c.png"), "t")
    np.testing.assert_allclose(shares, matrix / matrix.sum(axis=1, keepdims=True))
    axes = drawn_figures[0].axes[0]
    assert axes.images[0].get_clim() == (0.0, 1.0)
    texts = [text.get_text() for text in axes.texts]
    assert texts == [str(v) for v in matrix.ravel()]
    assert_picture(str(tmp_path / "c.png"))


def test_detection_confusion_counts_every_box_once():
    boxes = np.array([[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]], dtype=float)
    gt = {1: (boxes, np.array([0, 1, 2]))}
    found = np.array([[0, 0, 10, 10], [21, 21, 30, 30], [80, 80, 90, 90], [0, 0, 10, 9]], dtype=float)
    dets = {1: (found, np.array([0, 0, 1, 0]), np.array([0.9, 0.8, 0.7, 0.6]))}
    matrix = detection_confusion(gt, dets, 3, iou_threshold=0.5, score_threshold=0.65)
    expected = np.zeros((4, 4), int)
    expected[0, 0] = 1  # right
    expected[1, 0] = 1  # a rectangle called an ellipse
    expected[3, 1] = 1  # a rectangle where there is nothing
    expected[2, 3] = 1  # a ring missed (the 0.6 duplicate is under the score threshold)
    np.testing.assert_array_equal(matrix, expected)
    assert matrix.sum() == len(boxes) + 1  # the ground truth plus the unmatched prediction


def test_segmentation_confusion_matches_the_metric_and_merges(tmp_path, drawn_figures):
    torch.manual_seed(0)
    label = torch.randint(0, 4, (3, 16, 16))
    label[:, :2] = 255
    pred = torch.where(torch.rand(3, 16, 16) < 0.7, label.clamp(max=3), torch.randint(0, 4, (3, 16, 16)))
    whole, parts = SegMetric(4), [SegMetric(4), SegMetric(4)]
    whole.update(pred, {"label": label})
    parts[0].update(pred[:1], {"label": label[:1]})
    parts[1].update(pred[1:], {"label": label[1:]})
    merged = SegMetric(4)
    merged.load_states([p.state() for p in parts])
    np.testing.assert_array_equal(merged.confusion, whole.confusion)
    np.testing.assert_array_equal(np.diag(whole.confusion), whole.areas[0])  # intersections
    np.testing.assert_array_equal(whole.confusion.sum(axis=1), whole.areas[2])  # label areas
    np.testing.assert_array_equal(whole.confusion.sum(axis=0), whole.areas[1])  # prediction areas
    assert whole.confusion.sum() == int((label != 255).sum())
    written = write_report(whole.report(), str(tmp_path))
    assert [os.path.basename(p) for p in written] == ["confusion_matrix.png", "class_iou.png"]
    miou = whole.compute()["miou"]
    assert drawn_figures[-1].axes[0].get_title() == f"IoU per class (mIoU {miou:.4f})"
    for path in written:
        assert_picture(path)


class TextLines:
    """A stand-in rec dataset: ``read(i)`` gives sample i's PNG bytes (its grey level is i), and
    counts the reads."""

    def __init__(self, count):
        self.count, self.reads = count, []

    def read(self, index):
        self.reads.append(index)
        buffer = io.BytesIO()
        Image.fromarray(np.full((32, 100, 3), 5 * index, np.uint8)).save(buffer, format="PNG")
        return {"image": buffer.getvalue(), "label": "?"}

    def origin(self, index):
        return f"val.txt:{index + 1}"


def test_recognition_gallery_shows_the_worst_mistakes_first(tmp_path):
    rng = np.random.default_rng(1)
    labels, preds = [], []
    for i in range(40):
        label = "".join(rng.choice(list("abc01"), rng.integers(2, 6)))
        pred = label if i % 3 == 0 else "".join(rng.choice(list("abc01"), rng.integers(1, 6)))
        labels.append(label)
        preds.append((pred, float(rng.random())))
    states = []
    for start in (0, 20):  # two batches on two "ranks", merged as the evaluator does
        part = RecMetric()
        batch = {"image": torch.rand(20, 3, 32, 100), SAMPLE_INDEX_KEY: torch.arange(start, start + 20)}
        part.update({"preds": preds[start : start + 20], "labels": labels[start : start + 20]}, batch)
        states.append(part.state())
    metric = RecMetric()
    metric.load_states(states)
    dataset = TextLines(40)
    metric.bind_dataset(dataset)
    wrong = [
        (-Levenshtein.normalized_distance(pred, label), -score, index)
        for index, ((pred, score), label) in enumerate(zip(preds, labels))
        if pred != label
    ]
    expected = [index for _, _, index in sorted(wrong)[:GALLERY_SIZE]]  # worst distance, then score
    assert [m.index for m in metric.worst_mistakes()] == expected
    assert len(metric.mistakes) == len(wrong) and len(wrong) > GALLERY_SIZE
    written = write_report(metric.report(), str(tmp_path))
    names = [os.path.basename(p) for p in written]
    assert names == ["worst_mistakes.png", "worst_mistakes.md", "character_confusion.md"]
    assert sorted(dataset.reads) == sorted(expected)  # only the shown images are read, afterwards
    assert_picture(written[0], min_size=(1000, 400))
    listing = open(written[1], encoding="utf-8").read()
    rows = [line for line in listing.splitlines() if line.startswith("| ") and "val.txt" in line]
    assert [row.rsplit("|", 2)[1].strip() for row in rows] == [f"val.txt:{i + 1}" for i in expected]
    first = expected[0]
    assert f"| 1 | `{labels[first]}` | `{preds[first][0]}` | {preds[first][1]:.4f} |" in listing
    text = open(written[2], encoding="utf-8").read()
    assert f"# Character confusions of {len(wrong)} wrong prediction(s)" in text
    replaced = Counter()  # the substitution table counts rapidfuzz's edit operations
    for label, (pred, _) in zip(labels, preds):
        for op in Levenshtein.editops(label, pred):
            if op.tag == "replace":
                replaced[(label[op.src_pos], pred[op.dest_pos])] += 1
    (a, b), count = replaced.most_common(1)[0]
    assert f"| `{a}` | `{b}` | {count} |" in text


def test_dataset_image_decodes_what_the_dataset_stores():
    image = dataset_image(TextLines(3), 2)
    assert image.shape == (32, 100, 3) and image.dtype == np.uint8 and (image == 10).all()
    assert dataset_image(None, 2) is None and dataset_image(TextLines(3), -1) is None


def mistake_rows(path):
    """(rank, label, prediction, score, distance, sample) of each row of a ``worst_mistakes.md``."""
    rows = []
    for line in open(path, encoding="utf-8").read().splitlines()[4:]:
        n, label, pred, score, distance, origin = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((int(n), label, pred, float(score), float(distance), origin))
    return rows


@pytest.mark.slow
def test_eval_tool_and_training_write_the_pictures_with_1_and_2_processes(tmp_path, digits_dir):
    setup_logger(None)
    overrides = ["Global.max_iters=3", "Global.eval_batch_epoch=null"]
    config = tiny_run_config(tmp_path, digits_dir, "run", overrides + ["Global.eval_pictures=true"])
    build_trainer(config, DistEnv()).train()
    pictures = os.path.join(config["Global"]["save_model_dir"], "eval_pictures")
    files = ["character_confusion.md", "worst_mistakes.md", "worst_mistakes.png"]
    assert sorted(os.listdir(pictures)) == files
    assert_picture(os.path.join(pictures, "worst_mistakes.png"), min_size=(1000, 400))
    cfg = tiny_config(str(tmp_path / "eval.yml"), digits_dir, str(tmp_path / "run"))
    args = [
        "-c",
        cfg,
        "-o",
        f"Global.checkpoints={tmp_path / 'run' / 'latest'}",
        "Global.synthetic_data=null",
    ]
    outs = {}
    for nproc in (None, 2):  # one process, and two under torchrun (each evaluates half the set)
        outs[nproc] = str(tmp_path / f"eval_{nproc}")
        check_ok(run_tool(["eval.py", *args, "--output_dir", outs[nproc]], nproc=nproc))
        assert sorted(os.listdir(outs[nproc])) == files
        assert_picture(os.path.join(outs[nproc], "worst_mistakes.png"), min_size=(1000, 400))
    one, two = (mistake_rows(os.path.join(outs[n], "worst_mistakes.md")) for n in (None, 2))
    assert len(one) == GALLERY_SIZE and [r[:3] + r[4:] for r in one] == [r[:3] + r[4:] for r in two]
    assert [r[3] for r in one] == pytest.approx([r[3] for r in two], abs=2e-4)  # scores: CPU batching
    assert all(origin.startswith(os.path.join(digits_dir, "val.txt")) for *_, origin in one)
    read = [open(os.path.join(outs[n], "character_confusion.md"), encoding="utf-8").read() for n in (None, 2)]
    assert read[0] == read[1]


def test_global_eval_pictures_false_and_plot_curves_false_draw_nothing(tmp_path, digits_dir):
    setup_logger(None)
    overrides = ["Global.max_iters=2", "Global.eval_batch_epoch=null"]
    overrides += ["Global.eval_pictures=false", "Global.plot_curves=false"]
    config = tiny_run_config(tmp_path, digits_dir, "off", overrides)
    build_trainer(config, DistEnv()).train()
    written = sorted(os.listdir(config["Global"]["save_model_dir"]))
    assert "best_accuracy.pt" in written  # evaluated and saved
    assert "eval_pictures" not in written and "curves.png" not in written, written


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_coco_metric_draws_pr_curves_confusion_and_the_ap_table(tmp_path, backend):
    gt, table, annotations = coco_case(tmp_path, seed=2)
    metric = COCOMetric(backend=backend)
    names = ["ellipse", "rectangle", "ring"]
    metric.bind_dataset(
        SimpleNamespace(anno_file=str(tmp_path / "gt.json"), clsid2catid={0: 1, 1: 2, 2: 3}, label_list=names)
    )
    metric.load_states([{"detections": table, "image_ids": np.arange(1, 13)}])
    metrics = metric.compute()
    written = write_report(metric.report(iou_threshold=0.5, score_threshold=0.0), str(tmp_path / "out"))
    assert [os.path.basename(p) for p in written] == ["pr_curves.png", "class_ap.md", "confusion_matrix.png"]
    if backend == "faster_coco_eval":  # its own precision array, equal to pycocotools'
        keep = {}
        coco_bbox_eval(load_ground_truth(str(tmp_path / "gt.json")), table, list(range(1, 13)), keep=keep)
        np.testing.assert_allclose(metric.last_eval["precision"], keep["precision"], atol=1e-12)
    matrix = metric.confusion(0.5, 0.0)
    unmatched = matrix[3].sum()
    assert matrix[:3].sum() == len(annotations) and matrix.sum() == len(annotations) + unmatched
    assert matrix[:, :3].sum() == len(table)  # score 0: every prediction counted once
    assert np.trace(matrix[:3, :3]) > 0 and unmatched >= 12  # each image has one stray detection
    ap_table = open(written[1], encoding="utf-8").read()
    per_class = class_average_precision(metric.last_eval["precision"])
    assert all(f"| {n} | {ap:.4f} |" in ap_table for n, ap in zip(names, per_class))
    assert metrics["ap"] == pytest.approx(np.mean(per_class), abs=1e-9)
    for path in (written[0], written[2]):
        assert_picture(path)
