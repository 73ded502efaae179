"""Synthetic segmentation generator, its CLI sub-command and SegDataSet over its output."""

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from ppdist_testing import HANG_TIMEOUT_S, tree_digest

from ppdist.data.seg import SegDataSet
from ppdist.data.synthetic_io import SyntheticSettingError
from ppdist.data.synthetic_seg import generate_seg_dataset
from ppdist.data.transforms import Normalize
from ppdist.registry import SYNTHETIC_DATA

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("gen") / "seg")
    summary = generate_seg_dataset(root, num_train=24, num_val=8, seed=4, image_size=64, num_classes=6)
    return root, summary


def test_summary_and_layout(dataset):
    root, summary = dataset
    assert SYNTHETIC_DATA.get("seg") is generate_seg_dataset
    assert summary["skipped"] is False and summary["num_train"] == 24 and summary["num_val"] == 8
    assert sorted(os.listdir(root)) == [
        "images",
        "labels",
        "labels.txt",
        "synthetic_settings.json",
        "train.txt",
        "val.txt",
    ]
    assert not [n for n in os.listdir(os.path.dirname(root)) if n.startswith(".seg.tmp")]
    with open(os.path.join(root, "labels.txt")) as handle:
        assert handle.read().splitlines() == summary["class_names"] and len(summary["class_names"]) == 6
    for split, count in (("train", 24), ("val", 8)):
        with open(os.path.join(root, f"{split}.txt")) as handle:
            lines = handle.read().splitlines()
        assert len(lines) == count
        assert lines[0] == f"images/{split}/00000000.jpg labels/{split}/00000000.png"


def test_labels_values_and_classes(dataset):
    root, _ = dataset
    seen = set()
    for i in range(24):
        label = Image.open(os.path.join(root, "labels", "train", f"{i:08d}.png"))
        assert label.mode == "L" and label.size == (64, 64)
        values = set(np.unique(np.asarray(label)).tolist())
        assert values <= set(range(6)) | {255} and 255 in values
        seen |= values
        image = Image.open(os.path.join(root, "images", "train", f"{i:08d}.jpg"))
        assert image.size == (64, 64) and image.mode == "RGB"
    assert seen == set(range(6)) | {255}


def test_deterministic_and_split_streams(dataset, tmp_path):
    root, _ = dataset
    again = str(tmp_path / "again")
    generate_seg_dataset(again, num_train=24, num_val=8, seed=4, image_size=64, num_classes=6)
    assert tree_digest(again) == tree_digest(root)
    other = str(tmp_path / "other")
    generate_seg_dataset(other, num_train=24, num_val=8, seed=5, image_size=64, num_classes=6)
    assert tree_digest(other) != tree_digest(root)
    train0 = open(os.path.join(root, "labels/train/00000000.png"), "rb").read()
    val0 = open(os.path.join(root, "labels/val/00000000.png"), "rb").read()
    assert train0 != val0


def test_skip_when_present(dataset):
    root, _ = dataset
    summary = generate_seg_dataset(root, num_train=99, num_val=1, seed=0)
    assert summary["skipped"] is True and summary["num_train"] == 24 and summary["num_val"] == 8


def test_bad_arguments(tmp_path):
    with pytest.raises(SyntheticSettingError):
        generate_seg_dataset(str(tmp_path / "x"), 1, 1, num_classes=9)
    with pytest.raises(SyntheticSettingError):
        generate_seg_dataset(str(tmp_path / "x"), -1, 1)


def test_non_square_images(tmp_path):
    """``image_size: [width, height]`` (e.g. Cityscapes-sized 2048x1024 for the benchmark)."""
    root = str(tmp_path / "wide")
    generate_seg_dataset(root, num_train=3, num_val=1, seed=1, image_size=[80, 40], num_classes=4)
    ds = SegDataSet(root, [Normalize()], mode="train", num_classes=4, train_path="train.txt")
    item = ds[0]
    assert item["image"].shape == (3, 40, 80) and item["label"].shape == (40, 80)
    assert set(np.unique(item["label"])) <= {0, 1, 2, 3, 255}


def test_dataset_reads_generated_data(dataset):
    root, _ = dataset
    ds = SegDataSet(root, [Normalize()], mode="eval", num_classes=6, val_path="val.txt")
    item = ds[0]
    assert item["image"].shape == (3, 64, 64) and item["label"].shape == (64, 64)


def test_cli(tmp_path):
    out = str(tmp_path / "cli")
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "tools", "make_synthetic_data.py"),
            "seg",
            "--out",
            out,
            "--num",
            "6",
            "--num_val",
            "2",
            "--image_size",
            "32",
            "--num_classes",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=HANG_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"task": "seg"' in proc.stdout
    with open(os.path.join(out, "labels.txt")) as handle:
        assert len(handle.read().splitlines()) == 3
