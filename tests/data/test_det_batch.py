"""PadBatch joins images of different sizes as PaddleDetection's PadBatch does (fixture:
tests/fixtures/paddle_det_reader/make_reader.py)."""

import numpy as np
import pytest
from det_reader_testing import FIXTURE, images, sample

from ppdist.data.build import apply_batch_transforms
from ppdist.data.device_transforms import defer_to_device
from ppdist.data.transforms import NormalizeImage, PadBatch, Permute, Resize
from ppdist.errors import ConfigError


def normalised_batch():
    batch = []
    for name in ("wide", "tall"):  # 45x70 -> 39x60, 90x20 -> 60x13
        data = Resize([40, 60], True, 2)(sample(*images()[name]))
        data = NormalizeImage(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], is_scale=True)(data)
        batch.append(Permute()(data))
    return batch


@pytest.mark.parametrize("stride", [0, -1, 32])
def test_pad_batch_equals_paddledetection(stride):
    ref = dict(np.load(FIXTURE))
    padded = apply_batch_transforms([PadBatch(pad_to_stride=stride)], normalised_batch())
    side = 64 if stride > 0 else 60
    for name, data in zip(("wide", "tall"), padded):
        assert data["image"].shape == (3, side, side) and data["image"].dtype == np.float32
        np.testing.assert_allclose(data["image"], ref[f"pad{stride}_{name}_image"], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(data["im_shape"], ref[f"pad{stride}_{name}_im_shape"])
    tall = padded[1]["image"]
    assert not tall[:, 60:, :].any() and not tall[:, :, 13:].any() and tall[:, :60, :13].any()


def test_pad_batch_rounds_each_side_up_to_the_stride():
    samples = [{"image": np.ones((3, 33, 64), np.float32)}, {"image": np.ones((3, 20, 65), np.float32)}]
    assert PadBatch(32).padded_hw(samples) == (64, 96)
    assert (
        PadBatch(0).padded_hw(samples) == PadBatch(-1).padded_hw(samples) == (33, 65)
    )  # faster_reader.yml: -1


def test_normalisation_stays_on_the_host_before_pad_batch():
    """Zeros are padded after normalising (as PaddleDetection): the device cannot take it over."""
    norm = NormalizeImage(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], is_scale=True)
    sample_ops, batch_ops, transform = defer_to_device([norm, Permute()], [PadBatch(32)])
    assert transform is None and len(sample_ops) == 2 and len(batch_ops) == 1
    assert defer_to_device([norm, Permute()], [])[2] is not None  # without PadBatch it would


def test_bad_input_is_one_line():
    with pytest.raises(ConfigError, match="PadBatch.pad_to_stride must be an int"):
        PadBatch(1.5)
    with pytest.raises(ConfigError, match="put NormalizeImage and Permute before it"):
        PadBatch(32)([{"image": np.zeros((10, 12, 3), np.uint8)}])
