"""Synthetic detection generator: COCO layout, boxes, determinism, CLI, and COCODataSet over it."""

import json
import os
import sys

import cv2
import numpy as np
import pytest
from ppdist_testing import tree_digest

from ppdist.data.det import COCODataSet
from ppdist.data.synthetic_det import generate_det_dataset, render_det_sample
from ppdist.data.synthetic_io import SyntheticSettingError
from ppdist.data.transforms import Decode
from ppdist.registry import SYNTHETIC_DATA

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("gen") / "det")
    summary = generate_det_dataset(
        root, num_train=30, num_val=8, seed=3, image_size=64, num_classes=4, empty_ratio=0.2
    )
    return root, summary


def _load(root, split):
    with open(os.path.join(root, "annotations", f"instances_{split}.json")) as handle:
        return json.load(handle)


def test_summary_and_layout(dataset):
    root, summary = dataset
    assert SYNTHETIC_DATA.get("det") is generate_det_dataset
    assert summary["skipped"] is False and summary["num_train"] == 30 and summary["num_val"] == 8
    assert summary["category_ids"] == [1, 3, 5, 7]
    assert sorted(os.listdir(root)) == [
        "annotations",
        "images",
        "synthetic_settings.json",
        "train.txt",
        "val.txt",
    ]
    assert sorted(os.listdir(os.path.join(root, "annotations"))) == [
        "instances_train.json",
        "instances_val.json",
    ]
    assert not [n for n in os.listdir(os.path.dirname(root)) if n.startswith(".det.tmp")]
    with open(os.path.join(root, "train.txt")) as handle:
        lines = handle.read().splitlines()
    assert len(lines) == 30 and lines[0] == "images/train/00000000.jpg"
    assert all(os.path.isfile(os.path.join(root, line)) for line in lines)


def test_annotations(dataset):
    root, _ = dataset
    js = _load(root, "train")
    assert [c["id"] for c in js["categories"]] == [1, 3, 5, 7]
    assert [im["id"] for im in js["images"]] == list(range(1, 31))
    assert {a["category_id"] for a in js["annotations"]} == {1, 3, 5, 7}
    with_objects = {a["image_id"] for a in js["annotations"]}
    assert 0 < len(with_objects) < 30  # some images are empty
    sides = []
    for ann in js["annotations"]:
        x, y, w, h = ann["bbox"]
        assert ann["iscrowd"] == 0 and 0 < ann["area"] <= w * h
        assert x >= 0 and y >= 0 and x + w <= 64 and y + h <= 64
        sides.append(max(w, h) / 64)
    assert min(sides) < 0.2 and max(sides) > 0.4
    img = cv2.imread(os.path.join(root, "images", "train", "00000000.jpg"))
    assert img.shape == (64, 64, 3)


def test_boxes_are_tight_and_visible():
    rng = np.random.default_rng(0)
    for i in range(10):
        img, objects = render_det_sample(rng, i, (96, 96), 4, 6, 0.0)
        assert objects and objects[0][0] == i % 4
        for cls, (_, _, w, h), area in objects:
            assert 0 <= cls < 4 and area >= 12 and w * h >= area


def test_non_square_images(tmp_path):
    """``image_size: [width, height]`` (e.g. COCO-like 640x480 for the input-pipeline benchmark)."""
    root = str(tmp_path / "wide")
    generate_det_dataset(root, num_train=4, num_val=1, seed=2, image_size=[96, 64], num_classes=3)
    js = _load(root, "train")
    assert {(im["width"], im["height"]) for im in js["images"]} == {(96, 64)}
    assert cv2.imread(os.path.join(root, "images", "train", "00000000.jpg")).shape == (64, 96, 3)
    for ann in js["annotations"]:
        x, y, w, h = ann["bbox"]
        assert 0 <= x and x + w <= 96 and 0 <= y and y + h <= 64
    with pytest.raises(SyntheticSettingError, match="image_size"):
        generate_det_dataset(str(tmp_path / "bad"), 1, 1, image_size=[96, 16])


def test_deterministic_and_split_streams(dataset, tmp_path):
    root, _ = dataset
    again = str(tmp_path / "again")
    generate_det_dataset(
        again, num_train=30, num_val=8, seed=3, image_size=64, num_classes=4, empty_ratio=0.2
    )
    assert tree_digest(again) == tree_digest(root)
    other = str(tmp_path / "other")
    generate_det_dataset(
        other, num_train=30, num_val=8, seed=4, image_size=64, num_classes=4, empty_ratio=0.2
    )
    assert tree_digest(other) != tree_digest(root)
    assert _load(root, "train")["annotations"][:3] != _load(root, "val")["annotations"][:3]


def test_skip_when_present(dataset):
    root, _ = dataset
    summary = generate_det_dataset(root, num_train=99, num_val=1, seed=3)
    assert summary["skipped"] is True and summary["num_train"] == 30 and summary["num_val"] == 8


def test_coco_dataset_reads_it(dataset):
    root, _ = dataset
    ds = COCODataSet(root, "images/train", "annotations/instances_train.json", [Decode()])
    assert ds.catid2clsid == {1: 0, 3: 1, 5: 2, 7: 3} and ds.label_list == [
        "ellipse",
        "rectangle",
        "triangle",
        "ring",
    ]
    assert not ds.dropped_annotations
    sample = ds[0]
    assert sample["image"].shape == (64, 64, 3) and len(sample["gt_bbox"]) >= 1
    ev = COCODataSet(root, "images/val", "annotations/instances_val.json", [Decode()], mode="eval")
    assert len(ev) == 8


def test_cli(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "tools"))
    try:
        import make_synthetic_data
    finally:
        sys.path.pop(0)
    out = str(tmp_path / "cli")
    summary = make_synthetic_data.main(
        [
            "det",
            "--out",
            out,
            "--num",
            "6",
            "--num_val",
            "2",
            "--image_size",
            "48",
            "--num_classes",
            "3",
            "--seed",
            "1",
        ]
    )
    assert summary["task"] == "det" and summary["num_train"] == 6 and summary["category_ids"] == [1, 3, 5]
    assert os.path.isfile(os.path.join(out, "annotations", "instances_val.json"))
