"""Recorded detection geometry: a ``PendingImage`` drawn once equals the step-by-step arrays
(expansions, crops, flips in any order, fills included), and the PP-YOLOE training and eval
pipelines give the same boxes, labels and images (bitwise, every interpolation) whether the
geometry is drawn after each op or once by the resize."""

import random

import cv2
import numpy as np
import pytest

from ppdist.data.build import collate
from ppdist.data.pending_image import PendingImage, materialize
from ppdist.data.synthetic_det import render_det_sample
from ppdist.data.transforms import (
    BatchRandomResize,
    Decode,
    PadGT,
    RandomCrop,
    RandomDistort,
    RandomExpand,
    RandomFlip,
    Resize,
)
from ppdist.data.transforms.det import BATCH_INTERPS


def _expand(img, rng):
    h, w = img.shape[:2]
    new_h, new_w = h + int(rng.integers(0, 20)), w + int(rng.integers(0, 20))
    y, x = int(rng.integers(0, new_h - h + 1)), int(rng.integers(0, new_w - w + 1))
    fill = tuple(float(v) for v in rng.integers(0, 256, 3))
    canvas = np.empty((new_h, new_w, 3), np.uint8)
    canvas[:] = np.asarray(fill, np.uint8)
    canvas[y : y + h, x : x + w] = img
    return canvas, ("expand", new_h, new_w, y, x, fill)


def _crop(img, rng):
    h, w = img.shape[:2]
    y1, x1 = int(rng.integers(0, h)), int(rng.integers(0, w))
    y2, x2 = int(rng.integers(y1 + 1, h + 1)), int(rng.integers(x1 + 1, w + 1))
    return img[y1:y2, x1:x2].copy(), ("crop", x1, y1, x2, y2)


def _flip(img, rng):
    return img[:, ::-1].copy(), ("flip",)


def test_drawn_once_equals_step_by_step():
    """Random sequences of expansions (each with its own fill), crops (into the fill too) and flips."""
    rng = np.random.default_rng(0)
    steps = (_expand, _crop, _flip)
    for _ in range(400):
        eager = rng.integers(0, 256, (int(rng.integers(1, 12)), int(rng.integers(1, 12)), 3), dtype=np.uint8)
        lazy = PendingImage.of(eager)
        for _ in range(int(rng.integers(1, 7))):
            eager, (name, *args) = steps[int(rng.integers(0, 3))](eager, rng)
            lazy = getattr(lazy, name)(*args)
            assert lazy.shape == eager.shape
        drawn = lazy.materialize()
        assert drawn.dtype == np.uint8
        np.testing.assert_array_equal(drawn, eager)


def test_a_crop_inside_the_fill_is_all_fill():
    source = np.zeros((4, 4, 3), np.uint8)
    lazy = PendingImage.of(source).expand(20, 20, 0, 0, (9.0, 8.0, 7.0)).crop(10, 10, 15, 13)
    np.testing.assert_array_equal(lazy.materialize(), np.broadcast_to(np.uint8([9, 8, 7]), (3, 5, 3)))


def _image_bytes(seed: int, shape=(72, 96)) -> bytes:
    img, _ = render_det_sample(np.random.default_rng(seed), seed, shape, 4, 6, 0.0)
    return cv2.imencode(".png", img)[1].tobytes()  # lossless: the decoded pixels are the drawn ones


def _sample(seed: int):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 60, (4, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(4, 30, (4, 2))], 1).astype(np.float32)
    return {
        "image": _image_bytes(seed),
        "gt_bbox": np.minimum(boxes, [96, 72, 96, 72]).astype(np.float32),
        "gt_class": np.arange(4, dtype=np.int32).reshape(4, 1),
        "is_crowd": np.zeros((4, 1), np.int32),
    }


class DrawnAfter:
    """``op`` with its geometry drawn right after it: the step-by-step pipeline."""

    def __init__(self, op) -> None:
        self.op = op

    def __call__(self, data):
        return materialize(self.op(data))


def _run(ops, batch_op, seed: int, batch: int = 4):
    samples = []
    for k in range(batch):
        random.seed(seed * 100 + k)
        np.random.seed(seed * 100 + k)
        data = _sample(seed * 100 + k)
        for op in ops:
            data = op(data)
        samples.append(data)
    random.seed(seed)
    np.random.seed(seed)
    return collate(samples, [batch_op, PadGT()])


@pytest.mark.parametrize("interp", ["random"] + list(BATCH_INTERPS))
@pytest.mark.slow
def test_training_pipeline_drawn_once_equals_step_by_step(interp):
    """PP-YOLOE's training transforms: boxes and labels identical (not only within 1 px), images
    bitwise equal, for every interpolation of BatchRandomResize, over many seeds."""
    ops = [Decode(), RandomDistort(), RandomExpand(), RandomCrop(), RandomFlip()]
    resize = BatchRandomResize(
        target_size=[64, 96, 128, 160],
        random_interp=interp == "random",
        interp=0 if interp == "random" else interp,
    )
    for seed in range(25):
        lazy = _run(ops, resize, seed)
        eager = _run([DrawnAfter(op) for op in ops], resize, seed)
        assert set(lazy) == set(eager)
        for key, value in eager.items():
            if key.startswith("_"):
                continue
            assert value.dtype == lazy[key].dtype and np.array_equal(lazy[key].numpy(), value.numpy()), key


def test_eval_resize_of_a_recorded_flip():
    """``Resize`` (a sample op) draws the geometry too."""
    ops = [Decode(), RandomFlip(prob=1.0), Resize(target_size=[80, 80], interp=2)]
    random.seed(0)
    np.random.seed(0)
    lazy = ops[2](ops[1](ops[0](_sample(1))))
    eager = ops[2](materialize(ops[1](ops[0](_sample(1)))))
    assert isinstance(lazy["image"], np.ndarray)
    np.testing.assert_array_equal(lazy["image"], eager["image"])
    np.testing.assert_array_equal(lazy["gt_bbox"], eager["gt_bbox"])
