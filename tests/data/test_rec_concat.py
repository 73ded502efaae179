"""RecConAug joins a sample with extra samples its dataset loads (ext_op_transform_idx), as
PaddleOCR's RecConAug and SimpleDataSet do (fixture made by PaddleOCR), deterministically per
(seed, epoch, index); the PP-OCRv3 pipeline's batch has the contract's dtypes."""

import os

import cv2
import numpy as np
import pytest
import torch
from ppocrv3_data_testing import arrays, labels, script

from ppdist.data.base import BadSample
from ppdist.data.build import build_dataset, collate
from ppdist.data.transforms import RecConAug
from ppdist.errors import ConfigError

FX = arrays()
SCRIPT = script()
LABELS = "a0 b1 c2 d3 e4 f5".split()


@pytest.mark.parametrize("case", list(SCRIPT.CONCAT_CASES))
def test_concat_equals_paddleocr(case):
    first, *others = SCRIPT.concat_inputs(case)
    op = RecConAug(prob=1.0, image_shape=[48, 320, 3], max_text_length=25, ext_data_num=2)
    out = op(dict(first, ext_data=others))
    np.testing.assert_array_equal(out["image"], FX[f"concat/{case}"])
    assert out["label"] == labels()["concat"][case] and "ext_data" not in out


def test_concat_needs_the_dataset_extra_samples_and_valid_shape():
    with pytest.raises(KeyError, match="no extra samples to join"):
        RecConAug()({"image": np.zeros((4, 4, 3), np.uint8), "label": "a"})
    with pytest.raises(ConfigError, match=r"image_shape must be \[H, W, C\]"):
        RecConAug(image_shape=[48, 320])


@pytest.fixture(scope="module")
def line_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("lines")
    lines = []
    for i, label in enumerate(LABELS):
        img = np.full((32, 40, 3), 40 * i, np.uint8)
        cv2.imwrite(str(root / f"{i}.png"), img)
        lines.append(f"{i}.png\t{label}\n")
    (root / "train.txt").write_text("".join(lines), encoding="utf-8")
    return str(root)


def _config(root, transforms, **dataset):
    return {
        "Global": {"seed": 11, "max_text_length": 25, "character_dict_path": None, "use_space_char": False},
        "Train": {
            "dataset": dict(
                name="SimpleDataSet",
                data_dir=root,
                label_file_list=[os.path.join(root, "train.txt")],
                transforms=transforms,
                **dataset,
            ),
            "loader": {"batch_size_per_card": 2},
        },
    }


CONCAT = [
    {"DecodeImage": {"img_mode": "BGR", "channel_first": False}},
    {"RecConAug": {"prob": 1.0, "ext_data_num": 2, "image_shape": [48, 320, 3], "max_text_length": 25}},
]


def test_extra_samples_are_drawn_per_seed_epoch_and_index(line_set):
    dataset = build_dataset(_config(line_set, CONCAT, ext_op_transform_idx=1), "Train", "train")
    first = dataset[(2, 0, 11)]
    assert first["label"][:2] == "c2" and len(first["label"]) == 6  # its own text, then two others
    assert first["image"].shape == (48, 3 * 60, 3)  # three 32x40 lines at height 48, side by side
    for part in (first["label"][2:4], first["label"][4:]):
        index = LABELS.index(part)  # each extra sample's image is joined with its label
        assert np.all(first["image"][:, 60 * (1 + (part == first["label"][4:])) + 30] == 40 * index)
    dataset[(4, 0, 11)], dataset[(5, 3, 11)]  # other samples loaded in between: no effect
    assert dataset[(2, 0, 11)]["label"] == first["label"]
    others = {dataset[(2, epoch, 11)]["label"] for epoch in range(8)}
    assert len(others) > 1  # a new epoch draws other extra samples


def test_ext_op_transform_idx_must_stop_before_the_concatenation(line_set):
    with pytest.raises(
        ConfigError, match=r"Train.dataset.ext_op_transform_idx 2 puts .* RecConAug \(transform 1\)"
    ):
        build_dataset(_config(line_set, CONCAT), "Train", "train")  # PaddleOCR's default 2
    with pytest.raises(ConfigError, match="ext_op_transform_idx must be a number of transforms"):
        build_dataset(_config(line_set, CONCAT, ext_op_transform_idx=-1), "Train", "train")


def test_unreadable_extra_samples_are_drawn_again(line_set, tmp_path):
    root = tmp_path / "half"
    root.mkdir()
    (root / "0.png").write_bytes(open(os.path.join(line_set, "0.png"), "rb").read())
    (root / "train.txt").write_text("0.png\ta0\nmissing.png\tzz\n", encoding="utf-8")
    dataset = build_dataset(_config(str(root), CONCAT, ext_op_transform_idx=1), "Train", "train")
    assert dataset[(0, 0, 11)]["label"] == "a0a0a0"  # the missing image is never an extra sample


def test_ppocrv3_pipeline_batch_has_the_contract_dtypes(line_set):
    transforms = CONCAT + [
        {"RecAug": None},
        {"MultiLabelEncode": None},
        {"RecResizeImg": {"image_shape": [3, 48, 320]}},
        {"KeepKeys": {"keep_keys": ["image", "label_ctc", "label_sar", "length", "valid_ratio"]}},
    ]
    dataset = build_dataset(_config(line_set, transforms, ext_op_transform_idx=1), "Train", "train")
    samples = [dataset[(i, 0, 11)] for i in range(3)]
    assert not any(isinstance(s, BadSample) for s in samples)
    batch = collate(samples)
    expected = {
        "image": (torch.float32, (3, 3, 48, 320)),
        "label_ctc": (torch.int64, (3, 25)),
        "label_sar": (torch.int64, (3, 25)),
        "length": (torch.int64, (3,)),
        "valid_ratio": (torch.float32, (3,)),
    }
    assert {k: (v.dtype, tuple(v.shape)) for k, v in batch.items() if not k.startswith("_")} == expected
    assert batch["length"].tolist() == [6, 6, 6]  # each line joined with two others
    assert torch.all(batch["valid_ratio"] > 0) and torch.all(batch["valid_ratio"] <= 1)


def test_lmdb_dataset_joins_extra_samples_too(line_set, tmp_path):
    import lmdb

    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for i, label in enumerate(LABELS[:3], start=1):
            txn.put(b"image-%09d" % i, open(os.path.join(line_set, f"{i - 1}.png"), "rb").read())
            txn.put(b"label-%09d" % i, label.encode())
        txn.put(b"num-samples", b"3")
    env.close()
    config = _config(str(tmp_path), CONCAT)  # LMDBDataSet's default ext_op_transform_idx is 1
    config["Train"]["dataset"] = {"name": "LMDBDataSet", "data_dir": str(tmp_path), "transforms": CONCAT}
    sample = build_dataset(config, "Train", "train")[(1, 0, 11)]
    assert sample["label"][:2] == "b1" and len(sample["label"]) == 6 and sample["image"].shape == (48, 180, 3)
