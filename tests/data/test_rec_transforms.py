"""Recognition transforms: label encoding, resizing, augmentation, decoding, key selection."""

import random

import cv2
import numpy as np
import pytest

from ppdist.data.base import RejectedSample
from ppdist.data.transforms import CTCLabelEncode, DecodeImage, KeepKeys, RecAug, RecResizeImg
from ppdist.errors import ConfigError
from ppdist.registry import TRANSFORMS


def _line_image(h: int = 32, w: int = 120, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 200, np.uint8)
    cv2.putText(img, "ab12", (4, h - 8), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (20, 20, 20), 2)
    return np.clip(img + rng.integers(0, 20, img.shape), 0, 255).astype(np.uint8)


def test_all_ops_registered():
    for name in ("DecodeImage", "KeepKeys", "RecAug", "CTCLabelEncode", "RecResizeImg"):
        assert name in TRANSFORMS


# ----------------------------------------------------------------------------- CTCLabelEncode
def test_ctc_encode_default_dict_one_based_and_padded():
    enc = CTCLabelEncode(max_text_length=6)
    out = enc({"label": "a0z9"})
    # default dictionary "0-9a-z": '0' -> 1, '9' -> 10, 'a' -> 11, 'z' -> 36
    assert out["label"].tolist() == [11, 1, 36, 10, 0, 0]
    assert out["label"].dtype == np.int64
    assert out["length"].dtype == np.int64 and out["length"].shape == () and int(out["length"]) == 4
    assert out["label_ace"].shape == (37,)
    assert out["label_ace"][0] == 2 and out["label_ace"][11] == 1 and out["label_ace"].sum() == 6


def test_ctc_encode_lowercases_without_dict_and_drops_unknown():
    enc = CTCLabelEncode(max_text_length=10)
    out = enc({"label": "AbC-!1"})
    assert out["label"][: int(out["length"])].tolist() == [11, 12, 13, 2]


def test_ctc_encode_rejects_empty_too_long_and_nothing_left():
    enc = CTCLabelEncode(max_text_length=4)
    with pytest.raises(RejectedSample, match="empty label"):
        enc({"label": ""})
    with pytest.raises(RejectedSample, match="longer than"):  # longer than max_text_length (raw text)
        enc({"label": "abcde"})
    with pytest.raises(RejectedSample, match="no character"):  # nothing left after filtering
        enc({"label": "!!-"})
    assert enc({"label": "abcd"}) is not None


def test_ctc_encode_with_dictionary_keeps_case_and_space(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("a\nB\nc\n", encoding="utf-8")
    enc = CTCLabelEncode(max_text_length=5, character_dict_path=str(path), use_space_char=True)
    out = enc({"label": "aB c"})
    assert out["label"].tolist() == [1, 2, 4, 3, 0]  # space appended as index 4
    with pytest.raises(RejectedSample, match="no character"):  # no lower-casing with a dictionary
        enc({"label": "b"})


# ----------------------------------------------------------------------------- RecResizeImg
def test_resize_keeps_ratio_pads_and_normalises():
    op = RecResizeImg(image_shape=[3, 32, 100])
    out = op({"image": np.full((16, 20, 3), 255, np.uint8)})  # ratio 1.25 -> width 40
    img = out["image"]
    assert img.shape == (3, 32, 100) and img.dtype == np.float32
    assert np.allclose(img[:, :, :40], 1.0) and np.all(img[:, :, 40:] == 0.0)
    assert out["valid_ratio"] == pytest.approx(0.4)
    black = op({"image": np.zeros((32, 50, 3), np.uint8)})["image"]
    assert np.allclose(black[:, :, :50], -1.0)
    assert img.min() >= -1.0 and img.max() <= 1.0


def test_resize_wide_image_is_squeezed_to_width():
    out = RecResizeImg(image_shape=[3, 32, 100])({"image": _line_image(32, 400)})
    assert out["image"].shape == (3, 32, 100) and out["valid_ratio"] == 1.0


def test_resize_without_padding_stretches():
    out = RecResizeImg(image_shape=[3, 32, 100], padding=False)(
        {"image": np.full((16, 20, 3), 255, np.uint8)}
    )
    assert np.allclose(out["image"], 1.0) and out["valid_ratio"] == 1.0


def test_resize_eval_mode_variable_width():
    op = RecResizeImg(image_shape=[3, 32, 100], eval_mode=True)
    wide = op({"image": _line_image(32, 400)})
    assert wide["image"].shape == (3, 32, 400) and wide["valid_ratio"] == 1.0
    narrow = op({"image": _line_image(32, 60)})
    assert narrow["image"].shape == (3, 32, 100) and narrow["valid_ratio"] == pytest.approx(0.6)


def test_resize_infer_mode_needs_dictionary(tmp_path):
    img = _line_image(32, 400)
    assert (
        RecResizeImg(image_shape=[3, 32, 100], infer_mode=True)({"image": img.copy()})["image"].shape[2]
        == 100
    )
    path = tmp_path / "d.txt"
    path.write_text("a\n", encoding="utf-8")
    op = RecResizeImg(image_shape=[3, 32, 100], infer_mode=True, character_dict_path=str(path))
    assert op({"image": img})["image"].shape == (3, 32, 400)


def test_resize_gray_and_single_channel():
    gray = np.full((32, 64), 128, np.uint8)
    assert RecResizeImg(image_shape=[1, 32, 100])({"image": gray.copy()})["image"].shape == (1, 32, 100)
    assert RecResizeImg(image_shape=[3, 32, 100])({"image": gray.copy()})["image"].shape == (3, 32, 100)
    assert RecResizeImg(image_shape=[1, 32, 100])({"image": _line_image()})["image"].shape == (1, 32, 100)


def test_resize_bad_shape_is_config_error():
    with pytest.raises(ConfigError):
        RecResizeImg(image_shape=[32, 100])


# ----------------------------------------------------------------------------- RecAug
def _aug(img, seed, **probs):
    random.seed(seed)
    np.random.seed(seed)
    return RecAug(**probs)({"image": img.copy()})["image"]


@pytest.mark.parametrize("seed", range(12))
def test_recaug_output_is_valid_image(seed):
    img = _line_image(40, 160, seed)
    out = _aug(img, seed, tia_prob=0.8, crop_prob=0.8)
    assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3
    assert 40 - 8 <= out.shape[0] <= 40 and out.shape[1] == 160


def test_recaug_all_distortions_on():
    img = _line_image(48, 200)
    out = _aug(
        img,
        3,
        tia_prob=1,
        crop_prob=1,
        reverse_prob=1,
        noise_prob=1,
        jitter_prob=1,
        blur_prob=1,
        hsv_aug_prob=1,
    )
    assert out.dtype == np.uint8 and out.shape[1] == 200 and 40 <= out.shape[0] < 48
    assert not np.array_equal(out[: out.shape[0]], img[: out.shape[0]])


def test_recaug_deterministic_under_seed():
    img = _line_image(40, 160)
    for seed in range(5):
        assert np.array_equal(_aug(img, seed), _aug(img, seed))
    outs = [_aug(img, s, tia_prob=1.0) for s in range(4)]
    assert any(not np.array_equal(outs[0], o) for o in outs[1:])


def test_recaug_all_off_is_identity_and_small_images_only_get_the_perspective():
    from ppdist.data.transforms.warp import tia_perspective

    img = _line_image(40, 160)
    off = dict(
        tia_prob=0, crop_prob=0, reverse_prob=0, noise_prob=0, jitter_prob=0, blur_prob=0, hsv_aug_prob=0
    )
    assert np.array_equal(_aug(img, 0, **off), img)
    small = _line_image(16, 60)
    out = _aug(small, 0, **dict(off, tia_prob=1.0, crop_prob=1.0))
    np.random.seed(0)  # distort, stretch and crop need h, w >= 20; the perspective applies (PaddleOCR's)
    assert np.array_equal(out, tia_perspective(small)) and not np.array_equal(out, small)


def test_recaug_inversion_and_gray():
    img = _line_image(40, 160)
    off = dict(tia_prob=0, crop_prob=0, noise_prob=0, jitter_prob=0, blur_prob=0, hsv_aug_prob=0)
    assert np.array_equal(_aug(img, 0, reverse_prob=1.0, **off), 255 - img)
    gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
    out = _aug(
        gray,
        1,
        tia_prob=1,
        crop_prob=1,
        reverse_prob=1,
        noise_prob=1,
        jitter_prob=1,
        blur_prob=1,
        hsv_aug_prob=1,
    )
    assert out.ndim == 2 and out.dtype == np.uint8


# ----------------------------------------------------------------------------- DecodeImage
def test_decode_modes_and_garbage():
    img = _line_image()
    img[0, 0] = (255, 0, 0)  # pure blue in BGR
    raw = cv2.imencode(".png", img)[1].tobytes()
    bgr = DecodeImage(img_mode="BGR")({"image": raw})["image"]
    assert np.array_equal(bgr, img)
    rgb = DecodeImage(img_mode="RGB")({"image": raw})["image"]
    assert tuple(rgb[0, 0]) == (0, 0, 255)
    assert DecodeImage(img_mode="GRAY")({"image": raw})["image"].shape == (32, 120)
    assert DecodeImage(img_mode="BGR", channel_first=True)({"image": raw})["image"].shape == (3, 32, 120)
    assert DecodeImage()({"image": b"definitely not an image"}) is None
    assert DecodeImage()({"image": b""}) is None
    with pytest.raises(ConfigError):
        DecodeImage(img_mode="HSV")


# ----------------------------------------------------------------------------- KeepKeys
def test_keep_keys_selects_in_order_and_names_missing_key():
    data = {"image": 1, "label": 2, "length": 3, "img_path": "x"}
    assert list(KeepKeys(keep_keys=["label", "image"])(dict(data))) == ["label", "image"]
    with pytest.raises(KeyError) as info:
        KeepKeys(keep_keys=["image", "lenght"])(dict(data))
    msg = str(info.value)
    assert "'lenght'" in msg and "'length'" in msg and "'img_path'" in msg


def test_registry_builds_ops_with_injected_globals():
    op = TRANSFORMS.build(
        {"name": "CTCLabelEncode"}, max_text_length=25, character_dict_path=None, use_space_char=False
    )
    assert op({"label": "abc"})["label"].shape == (25,)
    with pytest.raises(ConfigError):
        TRANSFORMS.build({"name": "RecResizeImg", "image_shape": [3, 32, 100], "padd": True})
