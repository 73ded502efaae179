"""Synthetic text-line generator and its command-line tool."""

import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from ppdist.data import synthetic
from ppdist.data.synthetic import generate_rec_dataset
from ppdist.data.synthetic_io import SyntheticSettingError
from ppdist.registry import SYNTHETIC_DATA

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHARSET = "0123456789abcdefghijklmnopqrstuvwxyz"


def _read_labels(root, split):
    pairs = []
    with open(os.path.join(root, f"{split}.txt"), encoding="utf-8") as handle:
        for line in handle.read().splitlines():
            rel, label = line.split("\t")
            pairs.append((rel, label))
    return pairs


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("gen") / "rec")
    summary = generate_rec_dataset(root, num_train=80, num_val=30, seed=11)
    return root, summary


def test_summary_and_layout(dataset):
    root, summary = dataset
    assert SYNTHETIC_DATA.get("rec") is generate_rec_dataset
    assert summary["skipped"] is False and summary["num_train"] == 80 and summary["num_val"] == 30
    assert summary["fonts"]
    assert sorted(os.listdir(root)) == ["images", "synthetic_settings.json", "train.txt", "val.txt"]
    leftovers = [n for n in os.listdir(os.path.dirname(root)) if n.startswith(".rec.tmp")]
    assert leftovers == []


def test_label_files_parse_and_images_decode(dataset):
    root, _ = dataset
    for split, count in (("train", 80), ("val", 30)):
        pairs = _read_labels(root, split)
        assert len(pairs) == count
        for rel, label in pairs:
            assert not os.path.isabs(rel) and rel.startswith(f"images/{split}/")
            assert 3 <= len(label) <= 8 and all(c in CHARSET for c in label.lower())
        for rel, _ in pairs[:10]:
            img = cv2.imread(os.path.join(root, rel))
            assert img is not None and img.dtype == np.uint8 and img.shape[2] == 3
            assert 28 <= img.shape[0] <= 52 and img.shape[1] >= 20
            assert img.std() > 10  # text visible against the background


def test_val_strings_unseen_in_train(dataset):
    root, _ = dataset
    train = {label.lower() for _, label in _read_labels(root, "train")}
    val = [label.lower() for _, label in _read_labels(root, "val")]
    assert not train.intersection(val)


def test_deterministic_for_a_seed(dataset, tmp_path):
    root, _ = dataset
    again = str(tmp_path / "again")
    generate_rec_dataset(again, num_train=80, num_val=30, seed=11)
    for name in ("train.txt", "val.txt", "images/train/00000005.jpg", "images/val/00000007.jpg"):
        assert open(os.path.join(root, name), "rb").read() == open(os.path.join(again, name), "rb").read()
    other = str(tmp_path / "other")
    generate_rec_dataset(other, num_train=80, num_val=30, seed=12)
    assert _read_labels(other, "train") != _read_labels(root, "train")


def test_second_call_is_noop(dataset):
    root, _ = dataset
    stamp = os.stat(os.path.join(root, "train.txt")).st_mtime_ns
    summary = generate_rec_dataset(root, num_train=999, num_val=999, seed=5)
    assert summary["skipped"] is True and summary["num_train"] == 80 and summary["num_val"] == 30
    assert summary["differs"] == {
        "num_train": {"found": 80, "asked": 999},
        "num_val": {"found": 30, "asked": 999},
        "seed": {"found": 11, "asked": 5},
    }
    assert "differs" not in generate_rec_dataset(root, num_train=80, num_val=30, seed=11)
    assert os.stat(os.path.join(root, "train.txt")).st_mtime_ns == stamp


def test_refuses_foreign_non_empty_dir(tmp_path):
    target = tmp_path / "busy"
    target.mkdir()
    (target / "something.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        generate_rec_dataset(str(target), num_train=3, num_val=1)
    assert [n for n in os.listdir(tmp_path) if n.startswith(".busy.tmp")] == []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert generate_rec_dataset(str(empty), num_train=3, num_val=1)["num_train"] == 3


def test_pillow_default_font_fallback_and_exact_charset(tmp_path, monkeypatch):
    monkeypatch.setattr(synthetic, "find_fonts", lambda root=synthetic.FONT_ROOT: [])
    root = str(tmp_path / "fallback")
    summary = generate_rec_dataset(root, num_train=10, num_val=4, charset="AB12", min_len=2, max_len=4)
    assert summary["fonts"] == ["pillow-default"]
    labels = [label for _, label in _read_labels(root, "train")]
    assert all(set(label) <= set("AB12") and 2 <= len(label) <= 4 for label in labels)


def test_impossible_val_request_fails_clearly(tmp_path):
    with pytest.raises(SyntheticSettingError, match="outside the training set"):
        generate_rec_dataset(
            str(tmp_path / "tiny"), num_train=50, num_val=5, charset="a", min_len=1, max_len=2
        )


def test_command_line_tool(tmp_path):
    out = str(tmp_path / "cli")
    cmd = [
        sys.executable,
        os.path.join(REPO, "tools", "make_synthetic_data.py"),
        "rec",
        "--out",
        out,
        "--num",
        "12",
        "--num_val",
        "3",
        "--seed",
        "2",
    ]
    result = subprocess.run(
        cmd, capture_output=True, text=True, cwd=str(tmp_path), timeout=900
    )  # a hang, not slowness
    assert result.returncode == 0, result.stderr
    assert '"num_train": 12' in result.stdout
    assert len(_read_labels(out, "train")) == 12 and len(_read_labels(out, "val")) == 3
