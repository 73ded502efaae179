"""Segmentation transforms: geometry keeps image and label aligned, labels stay nearest."""

import random

import numpy as np
import pytest

from ppdist.data.transforms import (
    Normalize,
    RandomDistort,
    RandomHorizontalFlip,
    RandomPaddingCrop,
    RandomVerticalFlip,
    Resize,
    ResizeStepScaling,
)
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS


def _sample(h=40, w=60, dtype=np.uint8, seed=0):
    rng = np.random.default_rng(seed)
    label = rng.choice(np.array([0, 3, 7, 255], np.uint8), size=(h, w))
    image = (rng.random((h, w, 3)) * 255).astype(dtype)
    return {"image": image, "label": label, "gt_fields": ["label"]}


def _seed(s=0):
    random.seed(s)
    np.random.seed(s)


def test_registered():
    for name in (
        "ResizeStepScaling",
        "RandomPaddingCrop",
        "RandomHorizontalFlip",
        "RandomVerticalFlip",
        "RandomDistort",
        "Normalize",
        "Resize",
    ):
        assert name in TRANSFORMS


def test_resize_step_scaling_scales_and_nearest_labels():
    op = ResizeStepScaling(0.5, 2.0, 0.25)
    _seed(1)
    scales = {op.draw_scale() for _ in range(300)}
    assert scales == set(np.linspace(0.5, 2.0, 7).tolist())
    assert ResizeStepScaling(1.5, 1.5, 0.25).draw_scale() == 1.5
    uniform = ResizeStepScaling(0.5, 1.0, 0)
    assert all(0.5 <= uniform.draw_scale() <= 1.0 for _ in range(50))
    for s in range(10):
        _seed(s)
        data = _sample()
        values = set(np.unique(data["label"]).tolist())
        out = op(data)
        h, w = out["label"].shape
        assert out["image"].shape == (h, w, 3) and out["label"].dtype == np.uint8
        assert (w, h) in {(round(f * 60), round(f * 40)) for f in np.linspace(0.5, 2.0, 7)}
        assert set(np.unique(out["label"]).tolist()) <= values


def test_padding_crop_pads_with_values():
    _seed(0)
    data = _sample(10, 12, dtype=np.float32)
    out = RandomPaddingCrop(crop_size=[20, 16])(data)
    assert out["image"].shape == (16, 20, 3) and out["label"].shape == (16, 20)
    assert np.all(out["image"][10:] == 127.5) and np.all(out["image"][:, 12:] == 127.5)
    assert np.all(out["label"][10:] == 255) and np.all(out["label"][:, 12:] == 255)
    uint8 = RandomPaddingCrop(crop_size=[20, 16])(_sample(10, 12))
    assert uint8["image"].dtype == np.uint8 and np.all(uint8["image"][10:] == 127)


def test_padding_crop_random_window_is_aligned():
    data = _sample(50, 70)
    data["image"][..., 0] = data["label"]  # channel 0 mirrors the label
    seen = set()
    for s in range(20):
        _seed(s)
        out = RandomPaddingCrop(crop_size=(30, 20))(dict(data, image=data["image"].copy()))
        assert out["image"].shape[:2] == (20, 30)
        assert np.array_equal(out["image"][..., 0], out["label"])
        seen.add(out["image"].tobytes())
    assert len(seen) > 5


@pytest.mark.parametrize("op,axis", [(RandomHorizontalFlip(prob=1.0), 1), (RandomVerticalFlip(prob=1.0), 0)])
def test_flips_move_image_and_label_together(op, axis):
    data = _sample()
    image, label = data["image"].copy(), data["label"].copy()
    out = op(data)
    assert np.array_equal(out["image"], np.flip(image, axis)) and np.array_equal(
        out["label"], np.flip(label, axis)
    )
    untouched = RandomHorizontalFlip(prob=0.0)(_sample())
    assert np.array_equal(untouched["label"], label)


def test_flip_leaves_label_outside_gt_fields():
    data = _sample()
    data["gt_fields"] = []
    label = data["label"].copy()
    out = RandomHorizontalFlip(prob=1.0)(data)
    assert np.array_equal(out["label"], label)


def test_random_distort_shape_dtype_and_determinism():
    op = RandomDistort(brightness_prob=1, contrast_prob=1, saturation_prob=1, hue_prob=1, sharpness_prob=1)
    for dtype in (np.uint8, np.float32):
        _seed(5)
        a = op(_sample(dtype=dtype))["image"]
        _seed(5)
        b = op(_sample(dtype=dtype))["image"]
        assert a.shape == (40, 60, 3) and a.dtype == dtype and np.array_equal(a, b)
    _seed(6)
    assert not np.array_equal(op(_sample())["image"], a.astype(np.uint8))
    label = _sample()["label"]
    assert np.array_equal(op(_sample())["label"], label)
    with pytest.raises(ValueError):
        op({"image": np.zeros((4, 4), np.uint8)})


def test_normalize_values():
    data = {"image": np.array([[[0, 255, 51]]], np.uint8)}
    out = Normalize()(data)["image"]
    assert out.dtype == np.float32 and out.shape == (1, 1, 3)
    assert np.allclose(out, [[[-1.0, 1.0, -0.6]]])
    out = Normalize(mean=[0.0, 0.5, 0.2], std=[1.0, 0.25, 0.2])(
        {"image": np.array([[[0, 255, 51]]], np.uint8)}
    )
    assert np.allclose(out["image"], [[[0.0, 2.0, 0.0]]], atol=1e-6)


def test_resize_and_keep_ratio():
    out = Resize(target_size=[30, 16])(_sample())
    assert out["image"].shape == (16, 30, 3) and out["label"].shape == (16, 30)
    assert set(np.unique(out["label"]).tolist()) <= {0, 3, 7, 255}
    kept = Resize(target_size=[30, 30], keep_ratio=True, interp="NEAREST")(_sample(40, 60))
    assert kept["image"].shape == (20, 30, 3) and kept["label"].shape == (20, 30)
    data = _sample()
    data["gt_fields"] = []
    assert Resize(target_size=[30, 16], interp="CUBIC")(data)["label"].shape == (40, 60)
    wide = {
        "image": np.zeros((5, 5, 3), np.uint8),
        "label": np.full((5, 5), 3, np.int64),
        "gt_fields": ["label"],
    }
    out = Resize(target_size=[9, 7], interp="AREA")(wide)
    assert out["label"].dtype == np.int64 and out["label"].shape == (7, 9) and np.all(out["label"] == 3)


@pytest.mark.parametrize(
    "build,words",
    [
        (lambda: ResizeStepScaling(min_scale_factor=1.5, max_scale_factor=1.0), "ResizeStepScaling"),
        (lambda: ResizeStepScaling(scale_step_size=-1), "scale_step_size"),
        (lambda: RandomPaddingCrop(crop_size=[512]), "RandomPaddingCrop.crop_size"),
        (lambda: RandomPaddingCrop(crop_size=[512.0, 256]), "RandomPaddingCrop.crop_size"),
        (lambda: Resize(target_size=[0, 5]), "Resize.target_size"),
        (lambda: Resize(interp="BILINEAR"), "Resize.interp"),
        (lambda: RandomHorizontalFlip(prob=1.5), "RandomHorizontalFlip.prob"),
        (lambda: RandomDistort(hue_prob=2), "RandomDistort.hue_prob"),
        (lambda: RandomDistort(brightness_range=-0.1), "RandomDistort.brightness_range"),
        (lambda: Normalize(mean=[0.5], std=[0.5, 0.5]), "Normalize.mean"),
        (lambda: Normalize(std=[0.5, 0.0, 0.5]), "Normalize.std"),
    ],
)
def test_bad_params_raise_config_error(build, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        build()


def test_flip_of_every_dtype_is_numpys():
    from ppdist.data.transforms.seg import flip

    rng = np.random.default_rng(0)
    for dtype in (np.uint8, np.int32, np.int64, np.float32, np.bool_, np.uint16):
        for shape in ((5, 7), (5, 7, 3), (5, 7, 6)):
            arr = (rng.integers(0, 200, shape)).astype(dtype)
            for axis in (0, 1):
                out = flip(arr, axis)
                assert out.dtype == arr.dtype and out.flags.c_contiguous
                np.testing.assert_array_equal(out, np.flip(arr, axis))
