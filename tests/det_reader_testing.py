"""The images and samples of the reader fixture (tests/fixtures/paddle_det_reader/make_reader.py
writes the original's results on them; the reader tests replay them): numpy only."""

import os

import numpy as np

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "paddle_det_reader", "reader.npz")


def images():
    """{name: (uint8 RGB image, boxes)}: a wide 45x70 and a tall 90x20 image."""
    rng = np.random.RandomState(43)
    wide = rng.randint(0, 256, (45, 70, 3)).astype(np.uint8)
    tall = rng.randint(0, 256, (90, 20, 3)).astype(np.uint8)
    return {
        "wide": (wide, np.array([[3.5, 4.0, 60.25, 40.0], [10.0, 0.0, 70.0, 45.0]], np.float32)),
        "tall": (tall, np.array([[1.0, 2.5, 19.0, 88.0]], np.float32)),
    }


def sample(image, boxes):
    """A decoded detection sample, as PaddleDetection's Decode leaves it."""
    h, w = image.shape[:2]
    return {
        "image": image.copy(),
        "gt_bbox": boxes.copy(),
        "gt_class": np.zeros((len(boxes), 1), np.int32),
        "im_shape": np.array([h, w], np.float32),
        "scale_factor": np.array([1.0, 1.0], np.float32),
    }
