"""Dictionaries: PaddleOCR's ppocr_keys_v1.txt / en_dict.txt are bundled, and a PaddleOCR path to
them that does not exist here falls back to the bundled copy (an existing path always wins)."""

import os

import pytest
from ppdist_testing import ppdist_log_records

from ppdist.data import charset
from ppdist.data.charset import BUNDLED_DICT_DIR, load_characters, resolve_dict_path
from ppdist.errors import ConfigError


def test_bundled_dictionaries_are_paddleocrs():
    chinese = load_characters(os.path.join(BUNDLED_DICT_DIR, "ppocr_keys_v1.txt"), use_space_char=True)
    assert len(chinese) == 6623 + 1 and chinese[:3] == ["'", "疗", "绚"] and chinese[-2:] == ["懮", " "]
    english = load_characters(os.path.join(BUNDLED_DICT_DIR, "en_dict.txt"))
    assert len(english) == 95 and english[:3] == ["0", "1", "2"] and english[-1] == " "


def test_missing_paddleocr_path_falls_back_once_with_an_info_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(charset, "_reported", set())
    with ppdist_log_records() as records:
        first = resolve_dict_path("ppocr/utils/ppocr_keys_v1.txt")
        again = resolve_dict_path("ppocr/utils/ppocr_keys_v1.txt")
        english = resolve_dict_path("./ppdist/data/dicts/en_dict.txt")
    assert first == again == os.path.join(BUNDLED_DICT_DIR, "ppocr_keys_v1.txt")
    assert english == os.path.join(BUNDLED_DICT_DIR, "en_dict.txt")
    messages = [r.getMessage() for r in records]
    assert len(messages) == 2 and "ppocr/utils/ppocr_keys_v1.txt does not exist here" in messages[0]


def test_an_existing_path_wins_and_other_missing_paths_fail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "ppocr" / "utils" / "ppocr_keys_v1.txt"
    own.parent.mkdir(parents=True)
    own.write_text("a\nb\n", encoding="utf-8")
    assert load_characters("ppocr/utils/ppocr_keys_v1.txt") == ["a", "b"]
    for missing in ("ppocr/utils/dict/arabic_dict.txt", "elsewhere/en_dict.txt", "ppocr_keys_v1.txt"):
        with pytest.raises(ConfigError, match=f"character_dict_path: file not found: {missing}"):
            load_characters(missing)
