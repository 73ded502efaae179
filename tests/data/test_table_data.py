"""PubTabDataSet and the SLANet transforms equal PaddleOCR's (fixture made by
tests/fixtures/paddle_table/make_data_fixture.py), report bad lines as file:line, and collate into
the table batch."""

import copy
import importlib.util
import json
import os
import pickle

import cv2
import numpy as np
import pytest

from ppdist.data.base import BadSample, RejectedSample
from ppdist.data.build import build_dataset, collate
from ppdist.data.charset import BUNDLED_DICT_DIR, resolve_dict_path
from ppdist.data.index_cache import BUILDS
from ppdist.data.transforms import NormalizeImage, PaddingTableImage, TableBoxEncode, TableLabelEncode
from ppdist.errors import ConfigError

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "paddle_table")
_spec = importlib.util.spec_from_file_location(
    "make_table_data_fixture", os.path.join(HERE, "make_data_fixture.py")
)
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)
EXPECTED = dict(np.load(os.path.join(HERE, "table_data.npz")))
NAMES = list(fx.LINES)
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
# bad lines appended after the fixture's lines: (text, what the message says)
BAD_LINES = [
    ('{"filename": "simple.png", "html": {"structure": {"tokens": ["<tr>"]}', "not valid JSON"),
    (
        '{"filename": "simple.png", "html": {"structure": {"tokens": ["<tr>", "</tr>"]}}}',
        "'html.cells' is missing",
    ),
    ('{"html": {"structure": {"tokens": []}, "cells": []}}', "'filename'"),
]


@pytest.fixture(scope="module")
def table_root(tmp_path_factory):
    """Images of every fixture line, and labels.jsonl: the lines in LINES order, a blank line,
    then BAD_LINES."""
    root = tmp_path_factory.mktemp("pubtab")
    for height, width, seed, line in fx.LINES.values():
        path = root / line["filename"]
        path.parent.mkdir(parents=True, exist_ok=True)
        ok, png = cv2.imencode(".png", fx.table_image(height, width, seed))
        assert ok
        path.write_bytes(png.tobytes())
    lines = [json.dumps(line) for *_, line in fx.LINES.values()] + [""] + [text for text, _ in BAD_LINES]
    (root / "labels.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _config(root, transforms, cache="off"):
    dataset = {
        "name": "PubTabDataSet",
        "data_dir": str(root),
        "label_file_list": [str(root / "labels.jsonl")],
        "transforms": copy.deepcopy(transforms),
        "cache": cache,
    }
    return {"Global": {"seed": 1024}, "Eval": {"dataset": dataset}}


@pytest.fixture(scope="module")
def datasets(table_root):
    return {
        pipe: build_dataset(_config(table_root, ops), "Eval", "eval")
        for pipe, (ops, _, _) in fx.PIPELINES.items()
    }


CASES = [(pipe, name) for pipe, (_, names, _) in fx.PIPELINES.items() for name in names]


@pytest.mark.parametrize("pipe,name", CASES, ids=[f"{p}-{n}" for p, n in CASES])
def test_sample_equals_paddleocr(datasets, pipe, name):
    item = datasets[pipe][NAMES.index(name)]
    key = f"{pipe}/{name}/"
    if key + "rejected" in EXPECTED:
        assert isinstance(item, BadSample)
        assert item.origin.startswith(f"{datasets[pipe].label_files[0]}:{NAMES.index(name) + 1} (")
        expected = (
            "more cells than html.cells" if name == "few_cells" else "tokens; TableLabelEncode takes 1 to"
        )
        assert expected in item.reason
        return
    assert not isinstance(item, BadSample), item
    np.testing.assert_array_equal(item["structure"], EXPECTED[key + "structure"])
    assert item["structure"].dtype == np.int64
    np.testing.assert_allclose(item["bboxes"], EXPECTED[key + "bboxes"], rtol=1e-6, atol=0)
    np.testing.assert_array_equal(item["bbox_masks"], EXPECTED[key + "bbox_masks"].reshape(-1))
    np.testing.assert_allclose(item["shape"], EXPECTED[key + "shape"], rtol=1e-7, atol=0)
    assert item["shape"].dtype == np.float32 and item["shape"].shape == (6,)
    size = int(EXPECTED[key + "shape"][4])
    assert item["image"].shape == (3, size, size) and item["image"].dtype == np.float32
    if key + "image" in EXPECTED:  # within one grey level (OpenCV versions may round a resize apart)
        grey = (item["image"] - EXPECTED[key + "image"]) * STD[:, None, None].astype(np.float32) * 255
        assert np.abs(grey).max() <= 1.0 + 1e-3


def test_bad_lines_are_reported_as_file_and_line(datasets):
    dataset = datasets["slanet"]
    assert len(dataset) == len(NAMES) + len(BAD_LINES)  # the blank line is not a sample
    label_file = dataset.label_files[0]
    for k, (_, message) in enumerate(BAD_LINES):
        line_no = len(NAMES) + 2 + k  # after the blank line
        item = dataset[len(NAMES) + k]
        assert isinstance(item, BadSample)
        assert item.origin == f"{label_file}:{line_no}"
        assert item.reason.startswith("malformed line: ") and message in item.reason
        assert str(item).count(label_file) == 1  # the warning names the place once (issue 44)


def test_train_mode_replaces_a_bad_line_and_says_which(table_root):
    config = _config(table_root, fx.PIPELINES["merge_small"][0])
    config["Train"] = config.pop("Eval")
    dataset = build_dataset(config, "Train", "train")
    item = dataset[len(NAMES)]  # the first bad line: replaced by the next usable sample (simple.png)
    assert not isinstance(item, BadSample)
    assert item["_bad_samples"][0].startswith(f"{dataset.label_files[0]}:{len(NAMES) + 2}: ")
    np.testing.assert_array_equal(item["structure"], EXPECTED["merge_small/simple/structure"])


def test_collate_gives_the_table_batch(table_root):
    ops = copy.deepcopy(fx.PIPELINES["merge_small"][0])
    ops[-1]["KeepKeys"]["keep_keys"] = ["image", "structure", "bboxes", "bbox_masks", "length", "shape"]
    dataset = build_dataset(_config(table_root, ops), "Eval", "eval")
    batch = collate([dataset[NAMES.index(n)] for n in ("simple", "spans", "odd")])
    length = 32  # max_text_length 30 + sos + eos
    assert batch["image"].shape == (3, 3, 64, 64) and str(batch["image"].dtype) == "torch.float32"
    assert batch["structure"].shape == (3, length) and str(batch["structure"].dtype) == "torch.int64"
    assert batch["bboxes"].shape == (3, length, 4) and str(batch["bboxes"].dtype) == "torch.float32"
    assert batch["bbox_masks"].shape == (3, length) and str(batch["bbox_masks"].dtype) == "torch.float32"
    assert batch["shape"].shape == (3, 6) and str(batch["shape"].dtype) == "torch.float32"
    assert str(batch["length"].dtype) == "torch.int64"
    eos = int(batch["structure"][0].max())  # eos is the last token of the vocabulary
    expected = [
        int(np.flatnonzero(EXPECTED[f"merge_small/{n}/structure"] == eos)[0]) - 1
        for n in ("simple", "spans", "odd")
    ]
    assert batch["length"].tolist() == expected
    assert batch["_sample_index"].tolist() == [NAMES.index(n) for n in ("simple", "spans", "odd")]


def test_index_is_cached_and_mapped(table_root, tmp_path):
    ops = fx.PIPELINES["merge_small"][0]
    first = build_dataset(_config(table_root, ops, cache=str(tmp_path)), "Eval", "eval")
    mapped = BUILDS["mapped"]
    second = build_dataset(_config(table_root, ops, cache=str(tmp_path)), "Eval", "eval")
    assert BUILDS["mapped"] == mapped + 1 and os.listdir(tmp_path)
    assert len(second) == len(first)
    np.testing.assert_array_equal(second[0]["structure"], EXPECTED["merge_small/simple/structure"])
    unpickled = pickle.loads(pickle.dumps(second))  # as a spawned loader worker gets it
    assert unpickled.origin(1) == f"{second.label_files[0]}:2 (spans.png)"
    np.testing.assert_array_equal(unpickled[1]["structure"], EXPECTED["merge_small/spans/structure"])


def test_paddleocr_dictionary_paths_use_the_bundled_copies():
    for name in ("table_structure_dict.txt", "table_structure_dict_ch.txt"):
        assert resolve_dict_path(f"ppocr/utils/dict/{name}") == os.path.join(BUNDLED_DICT_DIR, name)
    encode = TableLabelEncode(
        max_text_length=10,
        character_dict_path="ppocr/utils/dict/table_structure_dict.txt",
        merge_no_span_structure=True,
    )
    assert (
        encode.character[0] == "sos"
        and encode.character[-2:] == ["<td></td>", "eos"]
        and "<td>" not in encode.character
    )
    assert len(encode.character) == 30  # 28 dictionary lines, <td> out, <td></td> in, sos and eos


def test_label_encode_learn_empty_box_and_bad_boxes():
    encode = TableLabelEncode(
        max_text_length=6, character_dict_path=os.path.join(BUNDLED_DICT_DIR, "table_structure_dict.txt")
    )
    cells = [{"tokens": ["a"], "bbox": [1, 2, 3, 4]}, {"tokens": []}]
    out = encode(
        {"structure": ["<tr>", "<td>", "</td>", "<td>", "</td>", "</tr>"], "cells": copy.deepcopy(cells)}
    )
    np.testing.assert_array_equal(out["bbox_masks"], [0, 0, 1, 0, 0, 0, 0, 0])
    assert int(out["length"]) == 6
    learn = TableLabelEncode(max_text_length=6, character_dict_path=encode_dict(), learn_empty_box=True)
    out = learn(
        {"structure": ["<tr>", "<td>", "</td>", "<td>", "</td>", "</tr>"], "cells": copy.deepcopy(cells)}
    )
    np.testing.assert_array_equal(out["bbox_masks"], [0, 0, 1, 0, 1, 0, 0, 0])
    with pytest.raises(RejectedSample, match=r"html.cells\[0\].bbox has 3 values; loc_reg_num is 4"):
        encode({"structure": ["<td>", "</td>"], "cells": [{"tokens": ["a"], "bbox": [1, 2, 3]}]})
    for bad in (["a", 2, 3, 4], [1, 2, 3, float("nan")], "1,2,3,4", [[1, 2], [3]]):  # issue 44: named
        with pytest.raises(RejectedSample) as info:
            encode({"structure": ["<td>", "</td>"], "cells": [{"tokens": ["a"], "bbox": bad}]})
        assert str(info.value) == f"html.cells[0].bbox must be finite numbers, got {bad!r}"
    with pytest.raises(RejectedSample, match="7 tokens; TableLabelEncode takes 1 to max_text_length 6"):
        encode({"structure": ["<tr>"] * 7, "cells": []})


def encode_dict():
    return os.path.join(BUNDLED_DICT_DIR, "table_structure_dict.txt")


def test_bad_options_fail_with_the_key():
    with pytest.raises(
        ConfigError, match="TableBoxEncode.out_box_format must be one of xyxy, xywh, xyxyxyxy"
    ):
        TableBoxEncode(out_box_format="cxcywh")
    with pytest.raises(
        ConfigError, match="'xywh' -> out_box_format 'xyxy' is not a conversion PaddleOCR makes"
    ):
        TableBoxEncode(in_box_format="xywh", out_box_format="xyxy")
    with pytest.raises(ConfigError, match=r"PaddingTableImage.size must be \[height, width\]"):
        PaddingTableImage(size=488)
    with pytest.raises(ConfigError, match="NormalizeImage.scale must be a positive number or text like"):
        NormalizeImage(scale="1/two")
    with pytest.raises(ConfigError, match="TableLabelEncode.max_text_length must be a positive integer"):
        TableLabelEncode(max_text_length=0, character_dict_path=encode_dict())
    assert NormalizeImage(scale="1./255.").scale == np.float32(1.0 / 255.0)


def test_padding_refuses_an_image_larger_than_its_size():
    data = {"image": np.zeros((70, 50, 3), np.float32), "shape": np.zeros(4, np.float32)}
    with pytest.raises(RejectedSample, match="image 70x50 is larger than PaddingTableImage.size 64x64"):
        PaddingTableImage(size=[64, 64])(data)


def test_normalize_order_chw_equals_hwc_transposed():
    img = np.random.RandomState(0).randint(0, 256, size=(5, 7, 3)).astype(np.uint8)
    hwc = NormalizeImage(scale="1./255.", order="hwc")({"image": img.copy()})["image"]
    chw = NormalizeImage(scale="1./255.", order="chw")(
        {"image": np.ascontiguousarray(img.transpose(2, 0, 1))}
    )["image"]
    np.testing.assert_array_equal(chw, hwc.transpose(2, 0, 1))
    assert NormalizeImage(order="chw").device_steps is None  # a CHW image is not normalised on the device
