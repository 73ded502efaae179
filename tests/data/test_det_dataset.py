"""COCODataSet: id mapping, annotation filtering and its warning, bad samples, empty images."""

import json
import logging
import os

import cv2
import numpy as np
import pytest

from ppdist.data.base import BAD_SAMPLES_KEY, BadSample
from ppdist.data.det import EVAL_KEYS, COCODataSet
from ppdist.data.transforms import Decode, NormalizeImage, Permute, Resize
from ppdist.errors import ConfigError, DataError
from ppdist.registry import DATASETS


def _ann(ann_id, im_id, cat, bbox, **extra):
    entry = {
        "id": ann_id,
        "image_id": im_id,
        "category_id": cat,
        "bbox": bbox,
        "area": float(bbox[2] * bbox[3]),
        "iscrowd": 0,
    }
    entry.update(extra)
    return entry


def _write(root, images, annotations, categories, present=None):
    os.makedirs(os.path.join(root, "imgs"), exist_ok=True)
    os.makedirs(os.path.join(root, "ann"), exist_ok=True)
    for im in images:
        if present is None or im["id"] in present:
            img = np.full((im["height"], im["width"], 3), 40 * (im["id"] % 5), np.uint8)
            cv2.imwrite(os.path.join(root, "imgs", im["file_name"]), img)
    with open(os.path.join(root, "ann", "inst.json"), "w") as handle:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, handle)


@pytest.fixture()
def coco_root(tmp_path):
    root = str(tmp_path)
    images = [{"id": i, "file_name": f"{i}.png", "width": 40, "height": 30} for i in (3, 1, 2, 4)]
    categories = [{"id": 10, "name": "ten"}, {"id": 2, "name": "two"}, {"id": 5, "name": "five"}]
    annotations = [
        _ann(1, 3, 5, [1, 2, 10, 8]),  # kept -> class 1
        _ann(2, 3, 10, [30, 20, 20, 20]),  # partly outside -> clipped to [30, 20, 40, 30]
        _ann(3, 3, 2, [0, 0, 5, 5], iscrowd=1),  # crowd
        _ann(4, 3, 2, [5, 5, 4, 4], area=0.0),  # area <= 0
        _ann(5, 3, 2, [5, 5, 0.0, 4], area=4.0),  # zero width
        _ann(6, 3, 2, [5, 5, 4, 4], ignore=1),  # ignore flag
        _ann(7, 3, 99, [5, 5, 4, 4]),  # unknown category
        _ann(8, 3, 2, [100, 5, 4, 4]),  # outside the image
        _ann(9, 2, 2, [2, 2, 6, 6]),  # image 2: file missing on disk
        _ann(10, 4, 5, [2, 2, 6, 6], iscrowd=1),  # image 4: only a crowd box
    ]
    _write(root, images, annotations, categories, present={1, 3, 4})
    return root


def _keys(sample):
    return {k for k in sample if not k.startswith("_")}  # "_..." keys belong to the loader plumbing


def _ds(root, mode="train", transforms=(), **kw):
    return COCODataSet(
        dataset_dir=root,
        image_dir="imgs",
        anno_path="ann/inst.json",
        transforms=list(transforms),
        mode=mode,
        **kw,
    )


def image_ids(dataset):
    """The COCO image id of each sample, in dataset order."""
    return [dataset.image_id(i) for i in range(len(dataset))]


def test_mapping_and_order(coco_root):
    assert DATASETS.get("COCODataSet") is COCODataSet
    ds = _ds(coco_root, mode="eval")
    assert ds.catid2clsid == {2: 0, 5: 1, 10: 2} and ds.clsid2catid == {0: 2, 1: 5, 2: 10}
    assert ds.label_list == ["two", "five", "ten"]
    assert ds.anno_file == os.path.join(coco_root, "ann", "inst.json") and os.path.isabs(ds.anno_file)
    assert image_ids(ds) == [1, 2, 3, 4]  # eval keeps every image
    train = _ds(coco_root)
    assert image_ids(train) == [2, 3]  # 1 has no annotation, 4 only a crowd one


def test_annotation_filtering_and_warning(coco_root, caplog):
    with caplog.at_level(logging.INFO, logger="ppdist"):
        ds = _ds(coco_root)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0]
    for part in (
        "crowd: 2",
        "ignore flag: 1",
        "area <= 0: 1",
        "width/height <= 1e-5: 1",
        "outside the image: 1",
        "unknown category: 1 [image 3 (ann 7)]",
    ):
        assert part in msg, msg
    assert ds.dropped_annotations["unknown category"] == 1
    sample = ds.read(image_ids(ds).index(3))
    np.testing.assert_allclose(sample["gt_bbox"], [[1, 2, 11, 10], [30, 20, 40, 30]])
    assert sample["gt_class"].ravel().tolist() == [1, 2] and sample["is_crowd"].ravel().tolist() == [0, 0]
    assert sample["gt_bbox"].dtype == np.float32 and sample["gt_class"].shape == (2, 1)
    assert (
        isinstance(sample["image"], bytes) and sample["im_id"] == 3 and (sample["h"], sample["w"]) == (30, 40)
    )


def test_only_crowd_drops_are_not_a_warning(tmp_path, caplog):
    images = [{"id": 1, "file_name": "1.png", "width": 20, "height": 20}]
    anns = [_ann(1, 1, 1, [1, 1, 5, 5]), _ann(2, 1, 1, [1, 1, 8, 8], iscrowd=1)]
    _write(str(tmp_path), images, anns, [{"id": 1, "name": "a"}])
    with caplog.at_level(logging.INFO, logger="ppdist"):
        ds = _ds(str(tmp_path))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(ds.read(0)["gt_bbox"]) == 1
    crowd = _ds(str(tmp_path), load_crowd=True).read(0)
    assert crowd["is_crowd"].ravel().tolist() == [0, 1]


def test_missing_image_is_a_bad_sample(coco_root):
    ops = [Decode(), Resize(target_size=[32, 32], keep_ratio=False, interp=2), NormalizeImage(), Permute()]
    ev = _ds(coco_root, mode="eval", transforms=ops)
    missing = ev[1]
    assert isinstance(missing, BadSample)
    assert "image id 2" in str(missing) and os.path.join("imgs", "2.png") in str(missing)
    good = ev[0]
    assert _keys(good) == set(EVAL_KEYS)
    train = _ds(coco_root, transforms=[Decode()])
    replaced = train[0]  # record 0 is image 2 (missing): replaced by its neighbour, and reported
    assert not isinstance(replaced, BadSample) and int(replaced["im_id"][0]) == 3
    assert "image id 2" in replaced[BAD_SAMPLES_KEY][0]


def test_output_formats(coco_root):
    ops = [Decode(), Resize(target_size=[32, 48], keep_ratio=False, interp=2), NormalizeImage(), Permute()]
    ev = _ds(coco_root, mode="eval", transforms=ops)[2]  # image 3
    assert ev["image"].shape == (3, 32, 48) and ev["image"].dtype == np.float32
    assert ev["im_id"].dtype == np.int64 and ev["im_id"].tolist() == [3]
    np.testing.assert_allclose(ev["ori_shape"], [30, 40])
    np.testing.assert_allclose(ev["im_shape"], [32, 48])
    np.testing.assert_allclose(ev["scale_factor"], [32 / 30, 48 / 40], rtol=1e-6)
    tr = _ds(coco_root, transforms=[Decode()])[1]
    assert _keys(tr) == {"image", "im_id", "im_shape", "scale_factor", "gt_bbox", "gt_class", "is_crowd"}
    assert (
        tr["gt_class"].dtype == np.int64
        and tr["gt_bbox"].dtype == np.float32
        and tr["image"].dtype == np.uint8
    )


def _empties_root(root, n_boxes=4, n_empty=6):
    images = [
        {"id": i + 1, "file_name": f"{i + 1}.png", "width": 16, "height": 16}
        for i in range(n_boxes + n_empty)
    ]
    anns = [_ann(i + 1, i + 1, 1, [1, 1, 5, 5]) for i in range(n_boxes)]
    _write(root, images, anns, [{"id": 1, "name": "a"}], present=set())
    return root


def test_allow_empty_and_empty_ratio(tmp_path):
    root = _empties_root(str(tmp_path))
    assert len(_ds(root)) == 4
    assert len(_ds(root, allow_empty=True)) == 10
    assert len(_ds(root, allow_empty=True, empty_ratio=0.0)) == 4
    half = _ds(root, allow_empty=True, empty_ratio=0.5)
    assert len(half) == 8 and int((np.diff(half.index["box_start"]) == 0).sum()) == 4
    ids = image_ids(half)
    assert ids == sorted(ids) and ids == image_ids(_ds(root, allow_empty=True, empty_ratio=0.5))
    assert len(_ds(root, allow_empty=True, empty_ratio=0.2)) == 5  # int(4 * 0.2 / 0.8) = 1 empty
    assert len(_ds(root, mode="eval")) == 10


def test_config_errors(tmp_path, coco_root):
    with pytest.raises(DataError, match="annotation file not found"):
        COCODataSet(coco_root, "imgs", "ann/nope.json", [])
    with pytest.raises(DataError, match="directory not found"):
        COCODataSet(str(tmp_path / "nope"), "imgs", "ann/inst.json", [])
    with pytest.raises(ConfigError, match="empty_ratio"):
        _ds(coco_root, empty_ratio=1.5)


@pytest.mark.parametrize("bbox", [[1, 2, "10", 8], [1, 2, float("nan"), 8], [1, 2, float("inf"), 8]])
def test_a_non_numeric_or_non_finite_bbox_names_its_annotation(tmp_path, bbox):
    root = str(tmp_path)
    images = [{"id": 1, "file_name": "1.png", "width": 40, "height": 30}]
    annotation = _ann(77, 1, 10, [1, 2, 10, 8])
    annotation["bbox"], annotation["area"] = bbox, 80.0
    _write(root, images, [annotation], [{"id": 10, "name": "ten"}])
    with pytest.raises(DataError, match="annotation id 77 \\(image id 1\\) has bbox .*four finite numbers"):
        COCODataSet(root, "imgs", "ann/inst.json", [], mode="eval")


def test_an_image_file_name_outside_dataset_dir_is_refused(tmp_path):
    root = tmp_path / "coco"
    (tmp_path / "secret.png").write_bytes(b"outside")
    images = [{"id": 1, "file_name": "../../secret.png", "width": 40, "height": 30}]
    _write(str(root), images, [_ann(1, 1, 10, [1, 2, 10, 8])], [{"id": 10, "name": "ten"}], present=set())
    dataset = COCODataSet(str(root), "imgs", "ann/inst.json", [], mode="eval")
    bad = dataset.load(0)
    assert isinstance(bad, BadSample) and "resolves outside" in bad.reason
    allowed = COCODataSet(str(root), "imgs", "ann/inst.json", [], mode="eval", allow_paths_outside_root=True)
    assert allowed.load(0)["image"] == b"outside"
