"""SegDataSet (file lists) and CityscapesDataSet (glob layout) on tiny files."""

import os

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from ppdist.data.base import BadSample
from ppdist.data.build import collate
from ppdist.data.seg import CityscapesDataSet, SegDataSet
from ppdist.data.transforms import (
    Normalize,
    RandomDistort,
    RandomHorizontalFlip,
    RandomPaddingCrop,
    Resize,
    ResizeStepScaling,
)
from ppdist.errors import ConfigError, DataError
from ppdist.registry import DATASETS


def _write_pair(root, img_rel, lbl_rel, h=24, w=32, values=(0, 1, 2, 255), seed=0, palette=False):
    rng = np.random.default_rng(seed)
    for rel in (img_rel, lbl_rel):
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    cv2.imwrite(os.path.join(root, img_rel), image)
    label = Image.fromarray(rng.choice(np.array(values, np.uint8), size=(h, w)), mode="L")
    if palette:
        label = label.convert("P")
    label.save(os.path.join(root, lbl_rel))
    return image[:, :, ::-1], np.asarray(label)


@pytest.fixture()
def tree(tmp_path):
    root = str(tmp_path / "data")
    pairs = [_write_pair(root, f"img/{i}.png", f"ann/{i}.png", seed=i) for i in range(3)]
    _write_pair(root, "img/big.png", "ann/big.png", values=(0, 9))  # value 9 >= num_classes
    _write_pair(root, "img/odd.png", "ann/odd.png")
    Image.fromarray(np.zeros((10, 32), np.uint8)).save(os.path.join(root, "ann/odd.png"))  # 32x10 label
    absolute = os.path.join(root, "img", "2.png")
    lines = [
        "img/0.png ann/0.png",
        "",
        "img/1.png ann/1.png",
        f"{absolute} {os.path.join(root, 'ann/2.png')}",
    ]
    with open(os.path.join(root, "train.txt"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    with open(os.path.join(root, "val.txt"), "w") as handle:
        handle.write(
            "img/0.png ann/0.png\nimg/big.png ann/big.png\nimg/odd.png ann/odd.png\n"
            "img/missing.png ann/0.png\nimg/1.png\n"
        )
    return root, pairs


def _train_ops():
    return [
        ResizeStepScaling(0.75, 1.25, 0.25),
        RandomPaddingCrop(crop_size=[16, 16]),
        RandomHorizontalFlip(),
        RandomDistort(),
        Normalize(),
    ]


def test_registered():
    assert "SegDataSet" in DATASETS and "CityscapesDataSet" in DATASETS


def test_train_items_and_collate(tree):
    root, pairs = tree
    ds = SegDataSet(root, _train_ops(), mode="train", num_classes=3, train_path="train.txt")
    assert len(ds) == 3  # blank line skipped; absolute paths accepted
    raw = ds.read(0)
    assert np.array_equal(raw["image"], pairs[0][0]) and np.array_equal(raw["label"], pairs[0][1])
    assert raw["gt_fields"] == ["label"]
    items = [ds[(i, 0, 5)] for i in range(3)]
    for item in items:
        assert {k for k in item if not k.startswith("_")} == {"image", "label"}
        assert item["image"].shape == (3, 16, 16) and item["image"].dtype == np.float32
        assert item["label"].shape == (16, 16) and item["label"].dtype == np.int64
        assert set(np.unique(item["label"]).tolist()) <= {0, 1, 2, 255}
    assert np.array_equal(ds[(1, 2, 5)]["image"], ds[(1, 2, 5)]["image"])
    batch = collate(items)
    assert batch["image"].shape == (3, 3, 16, 16) and batch["label"].dtype == torch.int64
    assert ds.origin(0) == f"{os.path.join(root, 'train.txt')}:1 (img/0.png)"
    assert ds.origin(1).endswith("train.txt:3 (img/1.png)")


def test_list_path_absolute_and_no_normalize(tree):
    root, pairs = tree
    ds = SegDataSet(root, [], mode="train", num_classes=3, train_path=os.path.join(root, "train.txt"))
    item = ds[0]
    assert item["image"].dtype == np.float32 and item["image"].max() > 1.5  # not rescaled
    assert np.array_equal(item["image"], pairs[0][0].transpose(2, 0, 1).astype(np.float32))


def test_eval_label_keeps_full_resolution_and_bad_samples(tree):
    root, pairs = tree
    ds = SegDataSet(
        root, [Resize(target_size=[16, 8]), Normalize()], mode="eval", num_classes=3, val_path="val.txt"
    )
    assert len(ds) == 5
    good = ds[0]
    assert good["image"].shape == (3, 8, 16) and good["label"].shape == (24, 32)
    assert np.array_equal(good["label"], pairs[0][1].astype(np.int64))
    bad = [ds[i] for i in range(1, 5)]
    assert all(isinstance(b, BadSample) for b in bad)
    assert "ann/big.png" in str(bad[0]) and "[9]" in str(bad[0])
    assert "ann/odd.png" in str(bad[1]) and "32x10" in str(bad[1])
    assert "img/missing.png" in str(bad[2]) and "cannot read image" in str(bad[2])
    assert bad[3].origin.endswith("val.txt:5") and "malformed" in bad[3].reason
    batch = collate([good] + bad)
    assert batch["image"].shape[0] == 1 and len(batch["_bad_samples"]) == 4


def test_train_replaces_bad_sample_and_reports_it(tree):
    root, _ = tree
    with open(os.path.join(root, "bad_train.txt"), "w") as handle:
        handle.write("img/big.png ann/big.png\nimg/0.png ann/0.png\n")
    ds = SegDataSet(root, [Normalize()], mode="train", num_classes=3, train_path="bad_train.txt")
    item = ds[0]
    assert item["image"].shape == (3, 24, 32) and "ann/big.png" in item["_bad_samples"][0]


def test_palette_label_kept_and_three_channel_label_rejected(tmp_path):
    root = str(tmp_path)
    _, label = _write_pair(root, "a.png", "a_l.png", values=(0, 4), palette=True)
    Image.fromarray(np.zeros((24, 32, 3), np.uint8)).save(os.path.join(root, "rgb_l.png"))
    with open(os.path.join(root, "list.txt"), "w") as handle:
        handle.write("a.png a_l.png\na.png rgb_l.png\n")
    ds = SegDataSet(root, [], mode="eval", num_classes=5, val_path="list.txt")
    assert set(np.unique(ds[0]["label"]).tolist()) == {0, 4}
    assert isinstance(ds[1], BadSample) and "rgb_l.png" in str(ds[1]) and "single-channel" in str(ds[1])


def test_config_and_data_errors(tree, tmp_path):
    root, _ = tree
    with pytest.raises(ConfigError, match=r"Train\.dataset\.train_path"):
        SegDataSet(root, [], mode="train", num_classes=3, val_path="val.txt")
    with pytest.raises(ConfigError, match=r"Eval\.dataset\.val_path"):
        SegDataSet(root, [], mode="eval", num_classes=3)
    with pytest.raises(ConfigError, match=r"num_classes"):
        SegDataSet(root, [], mode="train", train_path="train.txt")
    with pytest.raises(ConfigError, match=r"num_classes"):
        SegDataSet(root, [], mode="train", num_classes=0, train_path="train.txt")
    with pytest.raises(DataError, match="nope.txt"):
        SegDataSet(root, [], mode="train", num_classes=3, train_path="nope.txt")
    with pytest.raises(DataError, match="no_root"):
        SegDataSet(str(tmp_path / "no_root"), [], mode="train", num_classes=3, train_path="train.txt")


def _city(root, split, city, stem, label=True):
    _write_pair(
        root,
        f"leftImg8bit/{split}/{city}/{stem}_leftImg8bit.png",
        f"gtFine/{split}/{city}/{stem}_gtFine_labelTrainIds.png",
        h=8,
        w=16,
        values=(0, 18, 255),
    )
    if not label:
        os.remove(os.path.join(root, f"gtFine/{split}/{city}/{stem}_gtFine_labelTrainIds.png"))


def test_cityscapes_discovery(tmp_path):
    root = str(tmp_path / "cityscapes")
    for city, stem in (
        ("zurich", "zurich_000001_000019"),
        ("aachen", "aachen_000000_000019"),
        ("aachen", "aachen_000001_000019"),
    ):
        _city(root, "train", city, stem)
    _city(root, "val", "lindau", "lindau_000000_000019")
    train = CityscapesDataSet(root, [Normalize()], mode="train")
    assert len(train) == 3 and os.path.basename(train.origin(0)) == "aachen_000000_000019_leftImg8bit.png"
    assert os.path.basename(train.origin(2)).startswith("zurich")
    item = train[0]
    assert item["image"].shape == (3, 8, 16) and set(np.unique(item["label"]).tolist()) <= {0, 18, 255}
    val = CityscapesDataSet(root, [], mode="eval")
    assert len(val) == 1 and val.split == "val"
    assert len(CityscapesDataSet(root, [], mode="eval", split="train")) == 3


def test_cityscapes_errors(tmp_path):
    root = str(tmp_path / "cs")
    os.makedirs(root)
    with pytest.raises(DataError, match="labelTrainIds") as info:
        CityscapesDataSet(root, [], mode="train")
    assert "leftImg8bit" in str(info.value)
    _city(root, "train", "bonn", "bonn_000000_000019", label=False)
    _city(root, "train", "bonn", "bonn_000001_000019")
    with pytest.raises(DataError, match="bonn_000000_000019_gtFine_labelTrainIds.png"):
        CityscapesDataSet(root, [], mode="train")


def test_a_list_entry_outside_dataset_root_is_refused_unless_allowed(tree, tmp_path):
    root, _ = tree
    _write_pair(str(tmp_path), "elsewhere/x.png", "elsewhere/y.png")
    with open(os.path.join(root, "escape.txt"), "w") as handle:
        handle.write("../elsewhere/x.png ../elsewhere/y.png\n")
    common = {
        "dataset_root": root,
        "transforms": [],
        "mode": "train",
        "num_classes": 3,
        "train_path": "escape.txt",
    }
    dataset = DATASETS.build(dict(common, name="SegDataSet"))
    bad = dataset.load(0)
    assert isinstance(bad, BadSample) and "resolves outside" in bad.reason
    allowed = DATASETS.build(dict(common, name="SegDataSet", allow_paths_outside_root=True))
    assert isinstance(allowed.load(0), dict)


def test_label_values_is_np_unique():
    from ppdist.data.seg import _label_values

    rng = np.random.default_rng(0)
    for label in (
        rng.integers(0, 5, (40, 60)).astype(np.uint8),
        np.full((3, 3), 255, np.uint8),
        rng.integers(0, 300, (20, 20)).astype(np.int32),
    ):
        np.testing.assert_array_equal(_label_values(label), np.unique(label))
