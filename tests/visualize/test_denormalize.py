"""Display images: the normalisation the config's transform ops applied is undone exactly."""

import numpy as np
import pytest

from ppdist.data.transforms import DecodeImage, Normalize, NormalizeImage, Permute, RecResizeImg
from ppdist.visualize.denormalize import find_normalization, to_display


def pixels(height=12, width=20, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3)).astype(np.uint8)


@pytest.mark.parametrize(
    "op",
    [
        NormalizeImage(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], is_scale=True),
        NormalizeImage(mean=[100.0, 110.0, 120.0], std=[50.0, 60.0, 70.0], is_scale=False),
        NormalizeImage(is_scale=True, norm_type="none"),
        Normalize(mean=[0.4, 0.5, 0.6], std=[0.2, 0.3, 0.25]),
        Normalize(),  # the op's own defaults
    ],
)
def test_the_configured_normalization_is_inverted(op):
    image = pixels()
    data = op({"image": image.copy()})
    data = Permute()(data)  # CHW float32, as the model gets it
    normalization = find_normalization([op, Permute()])
    assert normalization is not None and normalization.source == type(op).__name__
    np.testing.assert_allclose(to_display(data["image"], normalization), image, atol=1)


def test_rec_resize_normalization_and_bgr_decoding_are_inverted():
    rgb = pixels(32, 100)
    bgr = np.ascontiguousarray(rgb[..., ::-1])
    decode, resize = DecodeImage(img_mode="BGR"), RecResizeImg(image_shape=[3, 32, 100])
    data = resize({"image": bgr.copy()})  # already 32 x 100: no resampling
    normalization = find_normalization([decode, resize])
    assert normalization.bgr and normalization.source == "RecResizeImg"
    np.testing.assert_allclose(to_display(data["image"], normalization), rgb, atol=1)


def test_without_normalization_pixels_are_shown_as_they_are_or_by_their_range():
    image = pixels()
    np.testing.assert_array_equal(to_display(image, None), image)
    stretched = to_display(image.astype(np.float32) * 4 - 300, None)  # outside 0..255: by range
    assert stretched.min() == 0 and stretched.max() == 255
