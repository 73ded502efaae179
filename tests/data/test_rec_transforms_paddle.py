"""RecResizeImg at PP-OCRv3's [3, 48, 320] and RecAug equal PaddleOCR's outputs (fixture made by
PaddleOCR's rec_img_aug; RecAug with the same seeds, noise off: its generator differs)."""

import random

import numpy as np
import pytest
from ppocrv3_data_testing import arrays, script

from ppdist.data.transforms import RecAug, RecResizeImg

FX = arrays()
SCRIPT = script()


@pytest.mark.parametrize("index,case", list(enumerate(SCRIPT.RESIZE_CASES)))
def test_resize_equals_paddleocr(index, case):
    h, w = SCRIPT.RESIZE_CASES[case]
    out = RecResizeImg(image_shape=[3, 48, 320])({"image": SCRIPT.text_image(100 + index, h, w)})
    resized = FX[f"resize/{case}"]  # the uint8 image PaddleOCR resized: its output, bit for bit
    expected = np.zeros((3, 48, 320), np.float32)
    expected[:, :, : resized.shape[2]] = (resized.astype(np.float32) / 255 - 0.5) / 0.5
    assert out["image"].dtype == np.float32
    np.testing.assert_array_equal(out["image"], expected)
    assert out["valid_ratio"].dtype == np.float32 and out["valid_ratio"].shape == ()
    assert float(out["valid_ratio"]) == np.float32(FX[f"resize_ratio/{case}"])


@pytest.mark.parametrize("seed", list(SCRIPT.RECAUG_SEEDS))
def test_recaug_equals_paddleocr_with_the_same_seeds(seed):
    probs = SCRIPT.recaug_probs(seed)
    random.seed(seed)
    tia = random.random() <= probs.get("tia_prob", 0.4)
    random.seed(seed)
    np.random.seed(seed)
    out = RecAug(**probs)({"image": SCRIPT.text_image(400, 48, 320)})["image"]
    expected = FX[f"recaug/{seed}"]
    assert out.shape == expected.shape and out.dtype == np.uint8
    diff = np.abs(out.astype(np.int16) - expected)
    # crop, blur, HSV, jitter and inversion are PaddleOCR's bit for bit; each TIA warp is within one
    # grey level (tests/data/test_warp.py), and three in a row (distort, stretch, perspective) within 2
    assert int(diff.max()) <= (2 if tia else 0) and diff.mean() < 0.5
