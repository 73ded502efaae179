"""MultiLabelEncode / SARLabelEncode: PaddleOCR's encodings (fixture made by PaddleOCR's
MultiLabelEncode: Chinese, spaces, unknown characters, too-long texts) and ppdist's reasons."""

import hashlib
import os

import numpy as np
import pytest
from ppocrv3_data_testing import labels

from ppdist.data.base import NOTES_KEY, RejectedSample
from ppdist.data.charset import BUNDLED_DICT_DIR
from ppdist.data.transforms import MultiLabelEncode, SARLabelEncode
from ppdist.errors import ConfigError

FIXTURE = labels()
DICT_FILES = {"ch": "ppocr_keys_v1.txt", "en": "en_dict.txt", "default": None}


@pytest.mark.parametrize("name", sorted(DICT_FILES))
def test_multi_label_encode_equals_paddleocr(name):
    entry = FIXTURE["dicts"][name]
    path = DICT_FILES[name] and os.path.join(BUNDLED_DICT_DIR, DICT_FILES[name])
    if path:
        with open(path, "rb") as handle:
            assert (
                hashlib.sha256(handle.read()).hexdigest() == entry["sha256"]
            )  # the bundled copy is PaddleOCR's
    encode = MultiLabelEncode(FIXTURE["max_text_length"], path, entry["use_space_char"])
    kept = 0
    for text, expected in zip(FIXTURE["texts"], entry["results"]):
        if expected is None:
            with pytest.raises(RejectedSample):
                encode({"label": text, "image": None})
            continue
        out = encode({"label": text, "image": None})
        for key in ("label_ctc", "label_sar", "length"):
            assert out[key].dtype == np.int64 and out[key].tolist() == expected[key], (text, key)
        kept += 1
    assert kept >= 5


def test_the_duplicated_space_of_en_dict_gets_its_last_index():
    path = os.path.join(BUNDLED_DICT_DIR, "en_dict.txt")  # holds " " and use_space_char appends another
    out = MultiLabelEncode(25, path, True)({"label": "a b", "image": None})
    assert out["label_ctc"][1] == 96 and out["label_sar"][2] == 95  # CTC 1-based, SAR 0-based


def test_sar_layout_and_reasons():
    sar = SARLabelEncode(max_text_length=6)  # 0-9a-z: 36 characters, then <UKN> 36, <BOS/EOS> 37, <PAD> 38
    out = sar({"label": "Ab1"})
    assert out["label"].tolist() == [37, 10, 11, 1, 37, 38] and int(out["length"]) == 3
    assert len(sar.character) == 39
    with pytest.raises(RejectedSample, match=r"SAR needs at most Global.max_text_length - 2 = 4"):
        sar({"label": "abcde"})
    with pytest.raises(RejectedSample, match="longer than Global.max_text_length 6"):
        sar({"label": "abcdefg"})
    with pytest.raises(ConfigError, match="at least 3"):
        SARLabelEncode(max_text_length=2)


def test_multi_label_keeps_paddleocrs_keys_and_ppdist_notes():
    encode = MultiLabelEncode(max_text_length=8)
    out = encode({"label": "ab?c", "image": "img", "img_path": "x.jpg", "label_ace": 1, "_sample": 7})
    assert set(out) == {"image", "img_path", "label_ctc", "label_sar", "length", "_sample", NOTES_KEY}
    assert out[NOTES_KEY] == ["label 'ab?c': 1 character(s) not in the dictionary dropped ('?')"]
    assert out["label_ctc"].tolist() == [11, 12, 13, 0, 0, 0, 0, 0] and int(out["length"]) == 3
    with pytest.raises(RejectedSample, match="SAR needs"):  # CTC would keep 7 characters
        encode({"label": "abcdefg", "image": None})
    with pytest.raises(ConfigError, match="gtc_encode"):
        MultiLabelEncode(max_text_length=8, gtc_encode="NRTRLabelEncode")
