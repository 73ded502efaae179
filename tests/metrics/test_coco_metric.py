"""COCOMetric equals pycocotools run directly on the written bbox.json; exact state merging."""

import json
import types

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from ppdist.metrics import coco
from ppdist.metrics.coco import STAT_NAMES, COCOMetric


@pytest.fixture()
def gt(tmp_path):
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 100, "height": 80} for i in (1, 2, 3)]
    anns = [
        {"id": 1, "image_id": 1, "category_id": 3, "bbox": [10, 10, 30, 20], "area": 600, "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 7, "bbox": [50, 40, 20, 30], "area": 600, "iscrowd": 0},
        {"id": 3, "image_id": 2, "category_id": 3, "bbox": [0, 0, 60, 60], "area": 3600, "iscrowd": 0},
    ]
    path = tmp_path / "gt.json"
    path.write_text(
        json.dumps(
            {
                "images": images,
                "annotations": anns,
                "categories": [{"id": 3, "name": "a"}, {"id": 7, "name": "b"}],
            }
        )
    )
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(path))
    return types.SimpleNamespace(
        coco=coco, anno_file=str(path), clsid2catid={0: 3, 1: 7}, label_list=["a", "b"]
    )


def _results():
    return [
        [
            {
                "im_id": 1,
                "boxes": torch.tensor([[10.0, 10.0, 40.0, 30.0], [52.0, 41.0, 70.0, 70.0]]),
                "scores": torch.tensor([0.9, 0.6]),
                "labels": torch.tensor([0, 1]),
            }
        ],
        [
            {
                "im_id": 2,
                "boxes": torch.tensor([[5.0, 0.0, 60.0, 55.0], [0.0, 0.0, 10.0, 10.0]]),
                "scores": torch.tensor([0.8, 0.3]),
                "labels": torch.tensor([0, 1]),
            },
            {
                "im_id": 3,
                "boxes": torch.zeros(0, 4),
                "scores": torch.zeros(0),
                "labels": torch.zeros(0, dtype=torch.long),
            },
        ],
    ]


def test_metric_equals_pycocotools_on_written_json_and_merges_exactly(gt, tmp_path):
    whole = COCOMetric(output_dir=str(tmp_path / "out"), classwise=True)
    whole.bind_dataset(gt)
    for res in _results():
        whole.update(res, {})
    metrics = whole.compute()
    with open(tmp_path / "out" / "bbox.json") as handle:
        dets = json.load(handle)
    assert len(dets) == 4 and dets[0]["category_id"] == 3 and dets[0]["bbox"] == [10.0, 10.0, 30.0, 20.0]
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt.coco, gt.coco.loadRes(str(tmp_path / "out" / "bbox.json")), "bbox")
        ev.evaluate(), ev.accumulate(), ev.summarize()
    assert [metrics[k] for k in ("ap", "ap50", "ap75")] == [float(v) for v in ev.stats[:3]]
    assert metrics["images"] == 3 and len(metrics["class_ap"]) == 2
    shards = []
    for res in _results():
        part = COCOMetric()
        part.bind_dataset(gt)
        part.update(res, {})
        shards.append(part.state())
    merged = COCOMetric(classwise=True)
    merged.bind_dataset(gt)
    merged.load_states(shards)
    assert merged.compute() == metrics


def test_no_detections_gives_zeros(gt):
    metric = COCOMetric()
    metric.bind_dataset(gt)
    metric.update(
        [
            {
                "im_id": 1,
                "boxes": torch.zeros(0, 4),
                "scores": torch.zeros(0),
                "labels": torch.zeros(0, dtype=torch.long),
            }
        ],
        {},
    )
    assert metric.compute()["ap"] == 0.0


def test_metric_needs_a_coco_dataset():
    with pytest.raises(ValueError, match="COCO-style"):
        COCOMetric().bind_dataset(object())


def _random_coco(tmp_path, images=40, seed=0):
    """A COCO set with every kind of case COCOeval distinguishes: 6 categories with sparse ids,
    small / medium / large and crowd boxes, images without objects; detections that hit (jittered),
    take the wrong class, duplicate a hit or miss, with tied scores. Returns (dataset, batches)."""
    rng = np.random.default_rng(seed)
    cat_ids = [1, 3, 5, 8, 13, 21]
    coco_images, anns, batches = [], [], []
    for image_id in range(1, images + 1):
        coco_images.append({"id": image_id, "file_name": f"{image_id}.jpg", "width": 640, "height": 480})
        boxes, labels, scores = [], [], []
        for _ in range(rng.integers(0, 9)):
            side = float(rng.choice([12.0, 24.0, 60.0, 140.0, 300.0])) * rng.uniform(0.7, 1.3)
            x, y = rng.uniform(0, 640 - side), rng.uniform(0, 480 - side * 0.8)
            label = int(rng.integers(0, 6))
            box = [x, y, side, side * 0.8]
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": image_id,
                    "category_id": cat_ids[label],
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": int(rng.random() < 0.05),
                }
            )
            for _ in range(int(rng.choice([0, 1, 1, 1, 2]))):  # missed, found, found twice
                jitter = rng.normal(0, side * 0.08, 4)
                x1, y1 = x + jitter[0], y + jitter[1]
                boxes.append([x1, y1, x1 + box[2] + jitter[2], y1 + box[3] + jitter[3]])
                labels.append(label if rng.random() < 0.85 else int(rng.integers(0, 6)))
                scores.append(round(float(rng.uniform(0.05, 1.0)), 1))  # ties
        for _ in range(rng.integers(0, 6)):  # false positives
            x1, y1, w, h = rng.uniform(0, 500), rng.uniform(0, 380), rng.uniform(8, 140), rng.uniform(8, 100)
            boxes.append([x1, y1, x1 + w, y1 + h])
            labels.append(int(rng.integers(0, 6)))
            scores.append(round(float(rng.uniform(0.01, 0.6)), 1))
        batches.append(
            [
                {
                    "im_id": image_id,
                    "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                    "scores": torch.tensor(scores, dtype=torch.float32),
                    "labels": torch.tensor(labels, dtype=torch.long),
                }
            ]
        )
    path = tmp_path / "random_gt.json"
    categories = [{"id": c, "name": f"c{c}"} for c in cat_ids]
    path.write_text(json.dumps({"images": coco_images, "annotations": anns, "categories": categories}))
    dataset = types.SimpleNamespace(
        anno_file=str(path), clsid2catid=dict(enumerate(cat_ids)), label_list=[c["name"] for c in categories]
    )
    return dataset, batches


@pytest.mark.parametrize("case", ["three images", "random set"])
def test_faster_backend_gives_the_pycocotools_numbers(gt, tmp_path, case):
    dataset, batches = (gt, _results()) if case == "three images" else _random_coco(tmp_path)
    metrics = {}
    for backend in ("pycocotools", "faster_coco_eval"):
        metric = COCOMetric(classwise=True, backend=backend)
        assert metric.backend == backend
        metric.bind_dataset(dataset)
        for res in batches:
            metric.update(res, {})
        metrics[backend] = metric.compute()
    reference, faster = metrics["pycocotools"], metrics["faster_coco_eval"]
    assert reference.keys() == faster.keys() and 0 < reference["ap"] < 1
    assert len({reference[name] for name in STAT_NAMES}) > 6  # not a degenerate case
    for key in reference:
        assert reference[key] == pytest.approx(faster[key], abs=1e-12), key
    with pytest.raises(ValueError, match="backend"):
        COCOMetric(backend="detectron2")


def test_the_default_backend_is_faster_coco_eval_when_installed(monkeypatch):
    assert COCOMetric().backend == "faster_coco_eval"
    assert COCOMetric(backend="pycocotools").backend == "pycocotools"
    monkeypatch.setattr(coco, "COCOeval_faster", None)  # as without the package
    assert COCOMetric().backend == "pycocotools"
    with pytest.raises(ValueError, match="faster_coco_eval is not installed"):
        COCOMetric(backend="faster_coco_eval")


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_evaluating_in_category_groups_gives_the_numbers_of_one_run(gt, backend):
    import numpy as np

    from ppdist.metrics.coco import coco_bbox_eval

    metric = COCOMetric(backend=backend)
    metric.bind_dataset(gt)
    for res in _results():
        metric.update(res, {})
    table, ids = metric.detections, metric.image_ids
    whole = coco_bbox_eval(metric.coco_gt, table, ids, classwise=True, backend=backend)
    grouped = coco_bbox_eval(metric.coco_gt, table, ids, classwise=True, backend=backend, max_cells=3)
    assert whole == grouped and whole["ap"] > 0  # one category of 3 images at a time
    assert np.isfinite(whole["class_ap"]).all() and len(whole["class_ap"]) == 2
