"""SimpleDataSet and LMDBDataSet over small generated data."""

import os
import pickle

import numpy as np
import pytest

from ppdist.data.base import BadSample
from ppdist.data.rec import LMDBDataSet, SimpleDataSet
from ppdist.data.synthetic import generate_rec_dataset
from ppdist.data.transforms import CTCLabelEncode, DecodeImage, KeepKeys, RecAug, RecResizeImg
from ppdist.errors import ConfigError, DataError
from ppdist.registry import DATASETS

MAX_LEN = 25


def crnn_ops(aug: bool = False):
    ops = [DecodeImage(img_mode="BGR", channel_first=False)]
    if aug:
        ops.append(RecAug())
    return ops + [
        CTCLabelEncode(max_text_length=MAX_LEN),
        RecResizeImg(image_shape=[3, 32, 100]),
        KeepKeys(keep_keys=["image", "label", "length"]),
    ]


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth") / "rec"
    generate_rec_dataset(str(root), num_train=40, num_val=12, seed=3)
    return str(root)


def _check_item(item):
    assert not isinstance(item, BadSample), item
    assert {k for k in item if not k.startswith("_")} == {"image", "label", "length"}
    assert item["image"].shape == (3, 32, 100) and item["image"].dtype == np.float32
    assert item["label"].shape == (MAX_LEN,) and item["label"].dtype == np.int64
    assert item["length"].dtype == np.int64 and item["length"].shape == ()
    assert 1 <= int(item["length"]) <= MAX_LEN and np.all(item["label"][int(item["length"]) :] == 0)


def line_numbers(dataset):
    """The 1-based line number of each sample of a SimpleDataSet, in dataset order."""
    return [dataset.lines.line(i)[1] for i in range(len(dataset))]


def test_registered():
    assert "SimpleDataSet" in DATASETS and "LMDBDataSet" in DATASETS


def test_simple_dataset_items(synth):
    ds = SimpleDataSet(
        data_dir=synth,
        label_file_list=[os.path.join(synth, "train.txt")],
        transforms=crnn_ops(aug=True),
        mode="train",
        seed=7,
    )
    assert len(ds) == 40
    for i in range(0, 40, 7):
        _check_item(ds[(i, 0, 7)])
    assert np.array_equal(ds[(3, 1, 7)]["image"], ds[(3, 1, 7)]["image"])  # per-sample seeding
    raw = ds.read(0)
    assert isinstance(raw["image"], bytes) and raw["img_path"].startswith(synth)
    assert (
        raw["label"]
        == open(os.path.join(synth, "train.txt"), encoding="utf-8").readline().rstrip("\n").split("\t")[1]
    )
    assert ds.origin(0) == f"{os.path.join(synth, 'train.txt')}:1 (images/train/00000000.jpg)"


def test_simple_dataset_several_files_and_ratio(synth):
    files = [os.path.join(synth, "train.txt"), os.path.join(synth, "val.txt")]
    both = SimpleDataSet(data_dir=synth, label_file_list=files, transforms=crnn_ops(), mode="eval")
    assert len(both) == 52
    half = SimpleDataSet(
        data_dir=synth,
        label_file_list=files,
        transforms=crnn_ops(),
        mode="eval",
        ratio_list=[0.5, 1.0],
        seed=1,
    )
    assert len(half) == 20 + 12
    again = SimpleDataSet(
        data_dir=synth,
        label_file_list=files,
        transforms=crnn_ops(),
        mode="eval",
        ratio_list=[0.5, 1.0],
        seed=1,
    )
    assert line_numbers(half) == line_numbers(again)  # fixed subset
    other = SimpleDataSet(
        data_dir=synth,
        label_file_list=files,
        transforms=crnn_ops(),
        mode="eval",
        ratio_list=[0.5, 1.0],
        seed=2,
    )
    assert line_numbers(half) != line_numbers(other)
    nums = line_numbers(half)[:20]
    assert nums == sorted(nums)  # file order kept; the sampler shuffles
    quarter = SimpleDataSet(data_dir=synth, label_file_list=files, transforms=crnn_ops(), ratio_list=0.25)
    assert len(quarter) == 10 + 3
    with pytest.raises(ConfigError, match="Train.dataset.ratio_list"):
        SimpleDataSet(data_dir=synth, label_file_list=files, transforms=[], ratio_list=[0.5])


def test_simple_dataset_delimiter_malformed_and_json_paths(synth, tmp_path):
    lines = open(os.path.join(synth, "val.txt"), encoding="utf-8").read().splitlines()
    label_file = tmp_path / "custom.txt"
    body = [lines[0].replace("\t", " "), "", "no-delimiter-here", lines[1].replace("\t", " ")]
    label_file.write_text("\n".join(body) + "\n", encoding="utf-8")
    ds = SimpleDataSet(
        data_dir=synth, label_file_list=[str(label_file)], transforms=crnn_ops(), mode="eval", delimiter=" "
    )
    assert len(ds) == 3  # blank line skipped, malformed line kept
    _check_item(ds[0])
    bad = ds[1]
    assert isinstance(bad, BadSample)
    assert str(bad) == (  # the location once, then why
        f"{label_file}:3: malformed line: expected 'image_path{{delimiter}}label' with delimiter ' ', "
        "got 'no-delimiter-here'"
    )
    _check_item(ds[2])
    # train mode replaces the bad sample by a neighbour and reports it
    train = SimpleDataSet(
        data_dir=synth, label_file_list=[str(label_file)], transforms=crnn_ops(), mode="train", delimiter=" "
    )
    item = train[1]
    assert not isinstance(item, BadSample) and f"{label_file}:3" in item["_bad_samples"][0]
    # a path starting with "[" is a JSON list; one entry is picked at random
    path0, label0 = lines[0].split("\t", 1)
    json_file = tmp_path / "json.txt"
    json_file.write_text(f'["{path0}", "{path0}"]\t{label0}\n', encoding="utf-8")
    ds_json = SimpleDataSet(
        data_dir=synth, label_file_list=[str(json_file)], transforms=crnn_ops(), mode="eval"
    )
    _check_item(ds_json[0])


def test_simple_dataset_missing_paths_and_images(synth, tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(DataError, match="Train.dataset.label_file_list") as info:
        SimpleDataSet(data_dir=synth, label_file_list=[missing], transforms=[])
    assert missing in str(info.value)
    with pytest.raises(DataError, match="Eval.dataset.data_dir"):
        SimpleDataSet(data_dir=str(tmp_path / "nodir"), label_file_list=[missing], transforms=[], mode="eval")
    label_file = tmp_path / "ghost.txt"
    label_file.write_text("images/none.jpg\tabc\n", encoding="utf-8")
    ds = SimpleDataSet(data_dir=synth, label_file_list=[str(label_file)], transforms=crnn_ops(), mode="eval")
    bad = ds[0]
    assert isinstance(bad, BadSample) and "none.jpg" in str(bad)


def test_simple_dataset_pickles(synth):
    ds = SimpleDataSet(
        data_dir=synth,
        label_file_list=[os.path.join(synth, "val.txt")],
        transforms=crnn_ops(aug=True),
        mode="eval",
    )
    clone = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(clone[(2, 0, 0)]["image"], ds[(2, 0, 0)]["image"])


# ----------------------------------------------------------------------------- LMDB
def _write_lmdb(path, samples):
    import lmdb

    os.makedirs(path, exist_ok=True)
    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, (image, label) in enumerate(samples, start=1):
            txn.put(b"image-%09d" % i, image)
            txn.put(b"label-%09d" % i, label.encode("utf-8"))
        txn.put(b"num-samples", str(len(samples)).encode())
    env.close()


@pytest.fixture(scope="module")
def lmdb_root(synth, tmp_path_factory):
    root = tmp_path_factory.mktemp("lmdb")
    pairs = []
    for line in open(os.path.join(synth, "train.txt"), encoding="utf-8").read().splitlines():
        rel, label = line.split("\t", 1)
        pairs.append((open(os.path.join(synth, rel), "rb").read(), label))
    _write_lmdb(root / "b_part", pairs[:10])
    _write_lmdb(root / "a_part" / "inner", pairs[10:16])
    return str(root), pairs


def test_lmdb_dataset_reads_all_leaves(lmdb_root):
    root, pairs = lmdb_root
    ds = LMDBDataSet(data_dir=root, transforms=crnn_ops(), mode="eval")
    assert len(ds) == 16
    assert ds.dirs == sorted(ds.dirs) and len(ds.dirs) == 2
    first = ds.read(0)  # sorted: a_part/inner first, 1-based keys
    assert first["label"] == pairs[10][1] and first["image"] == pairs[10][0]
    assert ds.read(6)["label"] == pairs[0][1]
    assert ds.origin(6).endswith("b_part:image-000000001")
    for i in (0, 5, 6, 15):
        _check_item(ds[i])


def test_lmdb_dataset_pickles_and_opens_lazily(lmdb_root):
    from ppdist.data import rec as rec_module

    root, _ = lmdb_root
    rec_module._process_envs()  # start from this process's (possibly empty) cache
    opened = set(rec_module._ENVS)
    ds = LMDBDataSet(data_dir=root, transforms=crnn_ops(aug=True), mode="train", seed=5)
    assert set(rec_module._ENVS) == opened  # counting leaves nothing open
    before = ds[(4, 0, 5)]
    clone = pickle.loads(pickle.dumps(ds))  # shares this process's environments
    assert np.array_equal(clone[(4, 0, 5)]["image"], before["image"])
    again = LMDBDataSet(data_dir=root, transforms=crnn_ops(), mode="eval")  # same LMDB, twice
    assert len(again) == len(ds)


def test_lmdb_dataset_in_forked_workers_after_parent_read(lmdb_root):
    import torch

    root, pairs = lmdb_root
    ds = LMDBDataSet(data_dir=root, transforms=crnn_ops(), mode="eval")
    parent = ds[0]  # the parent holds the environment open before the workers fork
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=2, collate_fn=list, multiprocessing_context="fork"
    )
    items = [item for batch in loader for item in batch]
    assert len(items) == 16 and not any(isinstance(i, BadSample) for i in items)
    assert np.array_equal(items[0]["image"], parent["image"])


def test_lmdb_dataset_ratio_and_errors(lmdb_root, tmp_path):
    root, _ = lmdb_root
    ds = LMDBDataSet(data_dir=root, transforms=[], ratio_list=[0.5, 1.0])
    assert len(ds) == 3 + 10
    with pytest.raises(DataError, match="Train.dataset.data_dir"):
        LMDBDataSet(data_dir=str(tmp_path / "missing"), transforms=[])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no LMDB"):
        LMDBDataSet(data_dir=str(empty), transforms=[], mode="eval")


def test_lmdb_missing_sample_is_bad_sample(tmp_path):
    import lmdb

    path = tmp_path / "db"
    _write_lmdb(path, [(b"garbage", "abc")])
    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"num-samples", b"2")  # claims one more sample than stored
    env.close()
    ds = LMDBDataSet(data_dir=str(tmp_path), transforms=crnn_ops(), mode="eval")
    assert len(ds) == 2
    assert "rejected" in str(ds[0])  # undecodable image -> DecodeImage returns None
    assert "image-000000002" in str(ds[1])  # missing key


def test_a_path_outside_data_dir_is_refused_before_it_is_read(tmp_path):
    data_dir = tmp_path / "data"
    (data_dir / "imgs").mkdir(parents=True)
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"not for the dataset")
    labels = data_dir / "labels.txt"
    labels.write_text(f"../secret.jpg\tabc\n{secret}\tabc\n", encoding="utf-8")
    dataset = SimpleDataSet(str(data_dir), [str(labels)], [], mode="eval")
    for index in range(2):
        item = dataset[index]
        assert isinstance(item, BadSample) and "resolves outside" in item.reason, item
    allowed = SimpleDataSet(str(data_dir), [str(labels)], [], mode="eval", allow_paths_outside_root=True)
    assert allowed[0]["image"] == b"not for the dataset"
