"""The PP-OCRv3 quick start's synthetic lines: the dictionary (what DejaVu draws of ppocr_keys_v1.txt,
without look-alikes), the lines drawn from it, determinism and the command-line tool."""

import importlib.util
import os

import cv2
import pytest

from ppdist.config import validate_synthetic_spec
from ppdist.data.synthetic import find_fonts
from ppdist.data.synthetic_io import SyntheticSettingError
from ppdist.data.synthetic_ppocr import (
    BUNDLED_DICT,
    CONFUSABLE,
    drawable_characters,
    generate_ppocrv3_rec_dataset,
    read_dictionary,
)
from ppdist.errors import ConfigError
from ppdist.registry import SYNTHETIC_DATA

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# a few lines of ppocr_keys_v1.txt's kinds: CJK, full-width, look-alikes, drawable Latin/Greek/Cyrillic/symbols
SOURCE = [
    "中",
    "a",
    "Ａ",
    "，",
    "Ο",
    "O",
    "0",
    "I",
    "l",
    "β",
    "Я",
    "€",
    "√",
    "　",
    "ab",
    "a",
    "1",
    "マ",
    "x",
    "K",
    "7",
]

pytestmark = pytest.mark.skipif(not find_fonts(), reason="needs the DejaVu fonts")


def labels(root, split):
    with open(os.path.join(root, f"{split}.txt"), encoding="utf-8") as handle:
        return [line.rstrip("\n").split("\t") for line in handle]


@pytest.fixture(scope="module")
def source_dict(tmp_path_factory):
    path = tmp_path_factory.mktemp("dict") / "keys.txt"
    path.write_text("".join(f"{c}\n" for c in SOURCE), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, source_dict):
    root = str(tmp_path_factory.mktemp("gen") / "ppocrv3")
    summary = generate_ppocrv3_rec_dataset(root, num_train=40, num_val=10, seed=3, source_dict=source_dict)
    return root, summary


def test_the_dictionary_keeps_single_drawable_characters_without_look_alikes():
    chars = drawable_characters(SOURCE, find_fonts())
    # not CJK/kana, full-width forms, the ideographic space, a two-character line, a repeat, Omicron/O/I
    assert chars == ["a", "0", "l", "β", "Я", "€", "√", "1", "x", "K", "7"]
    assert drawable_characters(SOURCE, find_fonts(), max_chars=3) == ["a", "0", "l"]
    assert {"Ο", "O", "I", "…"} <= CONFUSABLE


def test_dictionary_file_labels_and_images(dataset):
    root, summary = dataset
    assert SYNTHETIC_DATA.get("rec_ppocrv3") is generate_ppocrv3_rec_dataset
    chars = read_dictionary(os.path.join(root, "dict.txt"))
    assert chars == ["a", "0", "l", "β", "Я", "€", "√", "1", "x", "K", "7"]
    assert summary["num_chars"] == 11 and summary["character_dict_path"] == os.path.join(root, "dict.txt")
    assert (summary["num_train"], summary["num_val"], summary["skipped"]) == (40, 10, False)
    for split, count in (("train", 40), ("val", 10)):
        pairs = labels(root, split)
        assert len(pairs) == count
        for _, text in pairs:
            assert 4 <= len(text) <= 12 and set(text) <= set(chars) | {" "}
            assert text.count(" ") <= 1 and text == text.strip()
        for rel, _ in pairs[:5]:
            image = cv2.imread(os.path.join(root, rel))
            assert 28 <= image.shape[0] <= 52 and image.shape[1] * 48 / image.shape[0] <= 320  # fits 48x320
    train = {text.lower() for _, text in labels(root, "train")}
    assert not train.intersection(text.lower() for _, text in labels(root, "val"))


def test_space_ratio_and_lengths(tmp_path, source_dict):
    root = str(tmp_path / "spaces")
    generate_ppocrv3_rec_dataset(
        root, num_train=12, num_val=2, min_len=5, max_len=5, space_ratio=1.0, source_dict=source_dict
    )
    texts = [text for _, text in labels(root, "train")]
    assert all(len(text) == 5 and text.count(" ") == 1 and text[0] != " " != text[-1] for text in texts)
    none = str(tmp_path / "no_spaces")
    generate_ppocrv3_rec_dataset(none, num_train=12, num_val=2, space_ratio=0.0, source_dict=source_dict)
    assert not any(" " in text for _, text in labels(none, "train"))


def test_deterministic_for_a_seed(dataset, tmp_path, source_dict):
    root, _ = dataset
    again = str(tmp_path / "again")
    generate_ppocrv3_rec_dataset(again, num_train=40, num_val=10, seed=3, source_dict=source_dict)
    for name in ("dict.txt", "train.txt", "val.txt", "images/train/00000004.jpg"):
        assert open(os.path.join(root, name), "rb").read() == open(os.path.join(again, name), "rb").read()


def test_bad_arguments_fail_clearly(tmp_path, source_dict):
    with pytest.raises(SyntheticSettingError, match=r"space_ratio must be in \[0, 1\]"):
        generate_ppocrv3_rec_dataset(str(tmp_path / "a"), 2, 1, space_ratio=2.0, source_dict=source_dict)
    with pytest.raises(FileNotFoundError, match="dictionary not found: nope.txt"):
        generate_ppocrv3_rec_dataset(str(tmp_path / "b"), 2, 1, source_dict="nope.txt")
    with pytest.raises(ConfigError, match=r"unknown key Global\.synthetic_data\.charset"):
        validate_synthetic_spec({"kind": "rec_ppocrv3", "data_dir": "d", "charset": "abc"})


@pytest.mark.skipif(
    not os.path.isfile(BUNDLED_DICT), reason="ppocr_keys_v1.txt is bundled by issue 29's data part"
)
def test_the_bundled_chinese_dictionary_gives_a_few_hundred_characters():
    chars = drawable_characters(read_dictionary(BUNDLED_DICT), find_fonts())
    assert 150 <= len(chars) <= 300
    assert set("0123456789abcdefghijklmnopqrstuvwxyz") <= set(chars) and not set(chars) & CONFUSABLE


def test_command_line_tool(tmp_path, source_dict):
    spec = importlib.util.spec_from_file_location(
        "make_synthetic_data", os.path.join(REPO, "tools", "make_synthetic_data.py")
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)  # in this process: the subprocess's imports cost seconds
    out = str(tmp_path / "cli")
    argv = ["rec_ppocrv3", "--out", out, "--num", "6", "--num_val", "2", "--max_chars", "4"]
    summary = tool.main(argv + ["--source_dict", source_dict, "--space_ratio", "0"])
    assert summary["num_chars"] == 4 and (summary["num_train"], summary["num_val"]) == (6, 2)
    assert read_dictionary(os.path.join(out, "dict.txt")) == ["a", "0", "l", "β"]
