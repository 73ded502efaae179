"""Detection transforms: box consistency of every geometric op, batch ops, shared ops."""

import random

import cv2
import numpy as np
import pytest

import ppdist.data.transforms.det as det
from ppdist.data.pending_image import materialize
from ppdist.data.transforms import (
    BatchRandomResize,
    Decode,
    NormalizeImage,
    PadGT,
    Permute,
    RandomCrop,
    RandomDistort,
    RandomExpand,
    RandomFlip,
    Resize,
)
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS


def _coord_image(h, w):
    """RGB uint8 whose pixel (y, x) holds (x, y, 7): positions are readable after a crop."""
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx, yy, np.full_like(xx, 7)], axis=2).astype(np.uint8)


def _sample(h=60, w=80, boxes=((10, 5, 30, 25), (40, 30, 70, 55), (0, 0, 80, 60))):
    img = _coord_image(h, w)
    data = Decode()({"image": img})
    data["gt_bbox"] = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    data["gt_class"] = np.arange(len(data["gt_bbox"]), dtype=np.int32).reshape(-1, 1)
    data["is_crowd"] = np.zeros((len(data["gt_bbox"]), 1), np.int32)
    return data


def _seed(s):
    random.seed(s)
    np.random.seed(s)


def test_registered_under_paddledetection_names():
    for name in (
        "Decode",
        "RandomDistort",
        "RandomExpand",
        "RandomCrop",
        "RandomFlip",
        "Resize",
        "NormalizeImage",
        "Permute",
        "BatchRandomResize",
        "PadGT",
    ):
        assert name in TRANSFORMS
    assert TRANSFORMS.get("RandomDistort") is RandomDistort and TRANSFORMS.get("Resize") is Resize
    assert BatchRandomResize.batch_op and PadGT.batch_op and not getattr(RandomFlip, "batch_op", False)
    # the PP-YOLOE reader entries build as written there
    for name in ("Decode", "RandomDistort", "RandomCrop", "RandomFlip", "Permute", "PadGT"):
        TRANSFORMS.build({"name": name})
    with pytest.raises(ConfigError, match="unknown key"):
        TRANSFORMS.build({"name": "Decode", "to_rgb": True})
    TRANSFORMS.build({"name": "Resize", "target_size": [640, 640], "keep_ratio": False, "interp": 2})
    TRANSFORMS.build({"name": "RandomExpand", "fill_value": [123.675, 116.28, 103.53]})
    TRANSFORMS.build(
        {
            "name": "BatchRandomResize",
            "target_size": list(range(320, 769, 32)),
            "random_size": True,
            "random_interp": True,
            "keep_ratio": False,
        }
    )
    TRANSFORMS.build(
        {"name": "NormalizeImage", "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "norm_type": "none"}
    )


def test_decode_bytes_array_and_garbage():
    bgr = np.zeros((12, 20, 3), np.uint8)
    bgr[..., 2] = 200  # red in BGR
    raw = cv2.imencode(".png", bgr)[1].tobytes()
    out = Decode()({"image": raw})
    assert (
        out["image"].shape == (12, 20, 3) and out["image"].dtype == np.uint8 and out["image"][0, 0, 0] == 200
    )
    assert out["im_shape"].tolist() == [12, 20] and out["scale_factor"].tolist() == [1, 1]
    assert out["im_shape"].dtype == np.float32 and out["ori_shape"].tolist() == [12, 20] and out["h"] == 12
    again = Decode()({"image": out["image"]})  # already decoded: passed through
    assert again["image"] is out["image"]
    with pytest.raises(ValueError, match="cannot decode"):
        Decode()({"image": b"not an image"})


def test_random_flip_boxes():
    data = _sample()
    before = data["gt_bbox"].copy()
    out = materialize(RandomFlip(prob=1.0)(data))  # the flip is recorded, drawn when needed
    np.testing.assert_array_equal(out["gt_bbox"][:, [0, 2]], 80 - before[:, [2, 0]])
    np.testing.assert_array_equal(out["gt_bbox"][:, [1, 3]], before[:, [1, 3]])
    assert out["image"][0, 0, 0] == 79  # the former last column
    assert RandomFlip(prob=0.0)(_sample())["image"][0, 0, 0] == 0


def test_random_expand_keeps_content_under_boxes():
    for s in range(5):
        _seed(s)
        data = _sample()
        orig = data["image"].copy()
        out = materialize(RandomExpand(ratio=3.0, prob=1.0)(data))
        h, w = out["image"].shape[:2]
        assert h >= 60 and w >= 80 and out["im_shape"].tolist() == [h, w]
        for old, new in zip(_sample()["gt_bbox"].astype(int), out["gt_bbox"].astype(int)):
            np.testing.assert_array_equal(
                out["image"][new[1] : new[3], new[0] : new[2]], orig[old[1] : old[3], old[0] : old[2]]
            )
        assert out["image"][0, 0].tolist() in (
            [124, 116, 104],
            [0, 0, 7],
        )  # fill (rounded) or the image corner
    _seed(0)
    assert RandomExpand(prob=0.0)(_sample())["image"].shape == (60, 80, 3)
    with pytest.raises(ConfigError, match="ratio"):
        RandomExpand(ratio=1.0)


def test_random_crop_keeps_centres_and_never_empties():
    cropped = 0
    for s in range(40):
        _seed(s)
        data = _sample()
        boxes = data["gt_bbox"].copy()
        out = materialize(RandomCrop()(data))
        assert len(out["gt_bbox"]) >= 1
        assert len(out["gt_class"]) == len(out["gt_bbox"]) == len(out["is_crowd"])
        x0, y0 = (
            int(out["image"][0, 0, 0]),
            int(out["image"][0, 0, 1]),
        )  # crop origin from the coordinate image
        h, w = out["image"].shape[:2]
        assert out["im_shape"].tolist() == [h, w]
        cropped += (h, w) != (60, 80)
        crop = np.array([x0, y0, x0 + w, y0 + h], np.float32)
        for box, cls in zip(out["gt_bbox"], out["gt_class"].ravel()):
            src = boxes[cls]
            centre = (src[:2] + src[2:]) / 2
            assert np.all(centre >= crop[:2]) and np.all(centre < crop[2:])
            expect = (
                np.concatenate([np.maximum(src[:2], crop[:2]), np.minimum(src[2:], crop[2:])])
                - crop[[0, 1, 0, 1]]
            )
            np.testing.assert_allclose(box, expect)
            assert np.all(box[[0, 1]] >= 0) and box[2] <= w and box[3] <= h
        dropped = set(range(3)) - set(out["gt_class"].ravel().tolist())
        for cls in dropped:  # only boxes whose centre is outside the crop are dropped
            centre = (boxes[cls][:2] + boxes[cls][2:]) / 2
            assert not (np.all(centre >= crop[:2]) and np.all(centre < crop[2:]))
    assert cropped > 10
    empty = _sample(boxes=())
    assert RandomCrop()(empty)["image"].shape == (60, 80, 3)


def test_resize_detection_scale_factor_and_boxes():
    data = _sample()
    out = Resize(target_size=[30, 160], keep_ratio=False, interp=2)(data)  # [h, w] for detection
    assert out["image"].shape == (30, 160, 3) and out["image"].dtype == np.uint8  # as decoded
    assert out["im_shape"].tolist() == [30, 160]
    np.testing.assert_allclose(out["scale_factor"], [0.5, 2.0])
    np.testing.assert_allclose(out["gt_bbox"][0], [20, 2.5, 60, 12.5])
    kept = Resize(target_size=[40, 40], keep_ratio=True)(_sample())  # min/max rule: scale 0.5
    assert kept["image"].shape[:2] == (30, 40)
    np.testing.assert_allclose(kept["scale_factor"], [0.5, 0.5])
    twice = Resize(target_size=[120, 160])(Resize(target_size=[30, 40])(_sample()))
    np.testing.assert_allclose(twice["scale_factor"], [2.0, 2.0])  # relative to the decoded image
    seg = Resize(target_size=[30, 16])({"image": np.zeros((40, 60, 3), np.uint8)})  # no im_shape: [w, h]
    assert seg["image"].shape == (16, 30, 3)
    with pytest.raises(ConfigError, match="Resize.interp"):
        Resize(interp=9)


def test_normalize_and_permute():
    data = {"image": np.full((4, 5, 3), 255, np.uint8)}
    out = Permute()(NormalizeImage()(data))
    assert out["image"].shape == (3, 4, 5) and out["image"].dtype == np.float32
    np.testing.assert_allclose(
        out["image"][:, 0, 0], (1 - np.array([0.485, 0.456, 0.406])) / [0.229, 0.224, 0.225], rtol=1e-5
    )
    plus = NormalizeImage(norm_type="none")({"image": np.full((2, 2, 3), 51, np.uint8)})
    np.testing.assert_allclose(plus["image"], 0.2, rtol=1e-6)
    with pytest.raises(ConfigError, match="norm_type"):
        NormalizeImage(norm_type="minmax")


def test_random_distort_on_detection_sample():
    _seed(3)
    data = _sample()
    boxes = data["gt_bbox"].copy()
    out = RandomDistort()(data)
    np.testing.assert_array_equal(out["gt_bbox"], boxes)
    assert out["image"].shape == (60, 80, 3) and out["image"].dtype == np.uint8


def test_batch_random_resize_one_size_and_interp_per_batch(monkeypatch):
    calls = []
    real = cv2.resize

    def spy(img, size, interpolation):
        calls.append((size, interpolation))
        return real(img, size, interpolation=interpolation)

    monkeypatch.setattr(det.cv2, "resize", spy)
    op = BatchRandomResize(
        target_size=[32, 48, [40, 64]], random_size=True, random_interp=True, keep_ratio=False
    )
    sizes, interps = set(), set()
    for s in range(25):
        _seed(s)
        calls.clear()
        batch = op([_sample(60, 80), _sample(30, 50), _sample(64, 64)])
        shapes = {b["image"].shape for b in batch}
        assert len(shapes) == 1 and len(set(calls)) == 1
        ((size, interp),) = set(calls)
        sizes.add(size)
        interps.add(interp)
        for b in batch:
            h, w = b["image"].shape[:2]
            assert b["im_shape"].tolist() == [h, w]
            assert np.all(b["gt_bbox"][:, [0, 2]] <= w) and np.all(b["gt_bbox"][:, [1, 3]] <= h)
        np.testing.assert_allclose(batch[0]["scale_factor"], [h / 60, w / 80], rtol=1e-6)
        scale = np.array([w / 80, h / 60, w / 80, h / 60])
        np.testing.assert_allclose(batch[0]["gt_bbox"][0], np.array([10, 5, 30, 25]) * scale, rtol=1e-5)
    assert sizes == {(32, 32), (48, 48), (64, 40)} and len(interps) >= 3
    assert interps <= set(det.BATCH_INTERPS)


def test_pad_gt_masks():
    samples = [_sample(boxes=((1, 1, 5, 5),)), _sample(), _sample(boxes=())]
    out = PadGT()(samples)
    for s, n in zip(out, (1, 3, 0)):
        assert (
            s["gt_bbox"].shape == (3, 4) and s["gt_class"].shape == (3, 1) and s["is_crowd"].shape == (3, 1)
        )
        assert s["gt_class"].dtype == np.int64 and s["pad_gt_mask"].dtype == np.float32
        assert s["pad_gt_mask"].ravel().tolist() == [1.0] * n + [0.0] * (3 - n)
        assert not s["gt_bbox"][n:].any()
    np.testing.assert_array_equal(out[1]["gt_class"].ravel(), [0, 1, 2])
    empty = PadGT()([_sample(boxes=()), _sample(boxes=())])
    assert empty[0]["gt_bbox"].shape == (1, 4) and empty[0]["pad_gt_mask"].tolist() == [[0.0]]
    fixed = PadGT(num_max_boxes=5)([_sample()])
    assert fixed[0]["gt_bbox"].shape == (5, 4) and fixed[0]["pad_gt_mask"].sum() == 3


def test_box_iou_is_bitwise_the_formula():
    """RandomCrop's prepared IoU (boxes set up once per sample) computes what the plain float32
    formula does, bit for bit (so crops are accepted exactly as before)."""

    def formula(boxes, box):
        lt = np.maximum(boxes[:, :2], box[:2])
        rb = np.minimum(boxes[:, 2:], box[2:])
        inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
        area = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
        union = area + np.prod(box[2:] - box[:2]) - inter
        return inter / np.maximum(union, 1e-10)

    rng = np.random.default_rng(0)
    for _ in range(500):
        xy = rng.uniform(0, 500, (int(rng.integers(1, 20)), 2))
        boxes = np.concatenate([xy, xy + rng.uniform(0, 200, xy.shape)], 1).astype(np.float32)
        x, y = rng.integers(0, 400, 2)
        crop = np.array([x, y, x + rng.integers(1, 300), y + rng.integers(1, 300)], np.float32)
        ours, reference = det.BoxIoU(boxes)(crop), formula(boxes, crop)
        assert ours.dtype == reference.dtype == np.float32
        assert np.array_equal(ours.view(np.int32), reference.view(np.int32))


def _reference_crop(op, boxes, h, w):
    """RandomCrop's search as it was written first (IoU of every attempt by the plain formula):
    the crop window and kept box indices, or None."""

    def formula(box):
        lt = np.maximum(boxes[:, :2], box[:2])
        rb = np.minimum(boxes[:, 2:], box[2:])
        inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
        area = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
        return inter / np.maximum(area + np.prod(box[2:] - box[:2]) - inter, 1e-10)

    choices = list(op.thresholds) + (["no_crop"] if op.allow_no_crop else [])
    for idx in np.random.permutation(len(choices)):
        thresh = choices[idx]
        if thresh == "no_crop":
            return None
        for _ in range(op.num_attempts):
            crop = op._draw(h, w)
            if crop is None:
                continue
            iou = formula(crop)
            if iou.max() < thresh or (op.cover_all_box and iou.min() < thresh):
                continue
            _, keep = op._kept(boxes, crop)
            if keep.size:
                return crop, keep
    return None


@pytest.mark.parametrize("cover_all_box", [False, True])
def test_random_crop_search_is_the_plain_one(cover_all_box):
    """The IoU bound that skips hopeless attempts never skips one the plain search accepts: the
    same crops, the same kept boxes and the same random draws, over many samples."""
    op = RandomCrop(cover_all_box=cover_all_box)
    rng = np.random.default_rng(1)
    cropped = 0
    for seed in range(150):
        n = int(rng.integers(1, 12))
        xy = rng.uniform(0, 600, (n, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(1, 300, (n, 2)) * rng.uniform(0.05, 1)], 1)
        boxes = np.minimum(boxes, [640, 480, 640, 480]).astype(np.float32)
        data = {"image": np.zeros((480, 640, 3), np.uint8), "gt_bbox": boxes, "gt_class": np.arange(n)}
        _seed(seed)
        out = op(dict(data))
        after = np.random.uniform()
        _seed(seed)
        random.random()  # RandomCrop's prob draw
        expected = _reference_crop(op, boxes, 480, 640)
        assert np.random.uniform() == after
        if expected is None:
            assert out["gt_bbox"] is boxes
            continue
        cropped += 1
        crop, keep = expected
        assert out["image"].shape[:2] == (int(crop[3] - crop[1]), int(crop[2] - crop[0]))
        np.testing.assert_array_equal(out["gt_class"], keep)
    assert cropped > 50
