"""COCOMetric equals pycocotools run directly on the written bbox.json; exact state merging."""

import json
import types

import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from ppdist.metrics.coco import COCOMetric


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


def test_faster_backend_gives_the_pycocotools_numbers(gt):
    metrics = {}
    for backend in ("pycocotools", "faster_coco_eval"):
        metric = COCOMetric(classwise=True, backend=backend)
        metric.bind_dataset(gt)
        for res in _results():
            metric.update(res, {})
        metrics[backend] = metric.compute()
    reference, faster = metrics["pycocotools"], metrics["faster_coco_eval"]
    assert reference.keys() == faster.keys() and reference["ap"] > 0
    for key in reference:
        assert reference[key] == pytest.approx(faster[key], abs=1e-12), key
    with pytest.raises(ValueError, match="backend"):
        COCOMetric(backend="detectron2")


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
