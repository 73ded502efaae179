"""RandomResize / Resize(keep_ratio) and the rest of Faster R-CNN's sample transforms equal
PaddleDetection's operators (fixture: tests/fixtures/paddle_det_reader/make_reader.py)."""

import numpy as np
import pytest
from det_reader_testing import FIXTURE, images, sample

from ppdist.data.pending_image import materialize
from ppdist.data.transforms import NormalizeImage, Permute, RandomFlip, RandomResize, Resize
from ppdist.data.transforms.det import BATCH_INTERPS
from ppdist.errors import ConfigError

SIZES = [[32, 60], [40, 60], [48, 60]]
CASES = [(size, True, interp) for size in SIZES for interp in range(5)] + [([32, 60], False, 2)]


@pytest.fixture(scope="module")
def ref():
    with np.load(FIXTURE) as data:
        return dict(data)


def check(out, ref, key):
    image = materialize(out)["image"]
    assert image.dtype == np.uint8 and image.shape == ref[f"{key}_image"].shape, key
    np.testing.assert_array_equal(out["im_shape"], ref[f"{key}_im_shape"], err_msg=key)
    np.testing.assert_allclose(out["scale_factor"], ref[f"{key}_scale_factor"], rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(out["gt_bbox"], ref[f"{key}_gt_bbox"], rtol=1e-6, atol=1e-5, err_msg=key)
    expected = ref[f"{key}_image"]  # PaddleDetection's uint8 result, stored as float32
    assert np.array_equal(expected, np.round(expected)), key
    diff = np.abs(image.astype(np.int16) - expected.astype(np.int16))
    assert diff.max() == 0, (key, int(diff.max()))  # same cv2 resize: exactly equal


@pytest.mark.parametrize("name", ["wide", "tall"])
@pytest.mark.parametrize("size,keep,interp", CASES)
def test_resize_keep_ratio_equals_paddledetection(ref, name, size, keep, interp):
    key = f"{name}_{size[0]}x{size[1]}_k{int(keep)}_i{interp}"
    check(Resize(size, keep, interp)(sample(*images()[name])), ref, key)


def test_random_resize_replays_paddledetection_draws(ref):
    """Each of PaddleDetection's 40 recorded (size, interp) draws, given to RandomResize, gives its Resize."""
    op = RandomResize(SIZES, keep_ratio=True, random_interp=True)
    for size, interp in zip(ref["draw_sizes"].tolist(), ref["draw_interps"].tolist()):
        op.draw = lambda size=size, interp=interp: (tuple(size), interp)
        check(op(sample(*images()["wide"])), ref, f"wide_{size[0]}x{size[1]}_k1_i{interp}")


def test_random_resize_draws_every_size_and_interpolation():
    np.random.seed(0)
    op = RandomResize(SIZES, keep_ratio=True, random_interp=True)
    draws = [op.draw() for _ in range(300)]
    assert {size for size, _ in draws} == {tuple(s) for s in SIZES}
    assert {interp for _, interp in draws} == set(BATCH_INTERPS)
    fixed = RandomResize(SIZES, interp=2)
    assert {fixed.draw()[1] for _ in range(20)} == {2}
    ranged = RandomResize([[30, 60], [33, 64]], random_range=True)
    assert {ranged.draw()[0] for _ in range(200)} == {(30, 65), (31, 65), (32, 65), (33, 65)}
    out = RandomResize([40, 60], random_size=False)(sample(*images()["wide"]))
    assert out["im_shape"].tolist() == [39.0, 60.0]  # 45x70 -> short side 40 capped by long side 60


def test_flip_normalize_permute_equal_paddledetection(ref):
    data = Resize([40, 60], True, 2)(sample(*images()["wide"]))
    data = RandomFlip(prob=1.0)(data)
    np.testing.assert_array_equal(materialize(data)["image"], ref["flip_image"])
    np.testing.assert_allclose(data["gt_bbox"], ref["flip_gt_bbox"], rtol=1e-6)
    data = NormalizeImage(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], is_scale=True)(data)
    image = Permute()(data)["image"]
    assert image.shape == ref["norm_image"].shape and image.dtype == np.float32
    np.testing.assert_allclose(image, ref["norm_image"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"target_size": 800}, "RandomResize.target_size must be a non-empty list of sizes"),
        (
            {"target_size": [[1, 2], [3, 4], [5, 6]], "random_range": True},
            "[[min_short, long], [max_short, long]]",
        ),
        ({"target_size": [[40, 60], [30, 60]], "random_range": True}, "min_short 40 is above max_short 30"),
        ({"target_size": [[40, 60]], "interp": 9}, "RandomResize.interp must be a cv2 interpolation code"),
    ],
)
def test_bad_options_are_one_line(kwargs, message):
    with pytest.raises(ConfigError) as info:
        RandomResize(**kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)
