"""The TIA warps equal PaddleOCR's (text_image_aug) within one grey level: the same control points
drawn from the same seed, and the same image for the same points (fixture made by PaddleOCR)."""

import numpy as np
import pytest
from ppocrv3_data_testing import arrays, script

from ppdist.data.transforms.warp import (
    distort_points,
    perspective_points,
    stretch_points,
    tia_distort,
    warp_mls,
)

FX = arrays()
SCRIPT = script()
CASES = [
    (name, size, seed)
    for name in ("distort", "stretch", "perspective")
    for size in SCRIPT.WARP_SIZES
    for seed in (0, 1)
]


def _grey_diff(a: np.ndarray, b: np.ndarray) -> int:
    assert a.shape == b.shape and a.dtype == b.dtype == np.uint8
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


@pytest.mark.parametrize("name,size,seed", CASES)
def test_tia_points_and_image_equal_paddleocr(name, size, seed):
    case = f"{name}_{size}_{seed}"
    h, w = SCRIPT.WARP_SIZES[size]
    img = SCRIPT.text_image(200 + list(SCRIPT.WARP_SIZES).index(size), h, w)
    segments = int(FX[f"segments/{case}"])
    np.random.seed(seed)
    if name == "perspective":
        src, dst = perspective_points(w, h)
    else:
        src, dst = (distort_points if name == "distort" else stretch_points)(w, h, segments)
    np.testing.assert_array_equal(np.stack([src, dst]), FX[f"points/{case}"])  # PaddleOCR's draws
    out = warp_mls(img, src, dst)
    assert _grey_diff(out, FX[f"warp/{case}"]) <= 1
    assert not np.array_equal(out, img)  # the warp did move something


@pytest.mark.parametrize("case", ["node_first", "node_last"])
def test_a_grid_node_on_a_control_point_is_mapped_as_paddleocr(case):
    src, dst = FX[f"points/{case}"]
    out = warp_mls(SCRIPT.text_image(300, 48, 320), src, dst)
    assert _grey_diff(out, FX[f"warp/{case}"]) <= 1


def test_sharp_noise_within_one_grey_level():
    noise = np.random.RandomState(301).randint(0, 256, (32, 100, 3)).astype(np.uint8)
    np.random.seed(5)
    out = tia_distort(noise, 4)
    expected = FX["warp/distort_noise_5"]
    assert _grey_diff(out, expected) <= 1 and np.mean(out != expected) < 0.02
