"""Synthetic table generator (PubTabNet jsonl), its CLI sub-command and PubTabDataSet over it."""

import importlib.util
import json
import os

import cv2
import numpy as np
import pytest
from ppdist_testing import tree_digest

from ppdist.data.base import BadSample
from ppdist.data.build import build_dataset
from ppdist.data.synthetic_io import SyntheticSettingError
from ppdist.data.synthetic_table import _draw_text, generate_table_dataset, render_table
from ppdist.registry import SYNTHETIC_DATA

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    "make_synthetic_data", os.path.join(REPO, "tools", "make_synthetic_data.py")
)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("gen") / "table")
    summary = tool.main(
        ["table", "--out", root, "--num", "10", "--num_val", "3", "--seed", "3", "--span_ratio", "0.4"]
    )
    return root, summary


def _lines(root, split):
    with open(os.path.join(root, f"{split}.txt"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_summary_layout_and_spans(tables):
    root, summary = tables
    assert SYNTHETIC_DATA.get("table") is generate_table_dataset
    assert summary["skipped"] is False and summary["num_train"] == 10 and summary["num_val"] == 3
    lines = _lines(root, "train") + _lines(root, "val")
    assert [d["imgid"] for d in lines] == list(range(10)) + list(range(3))
    tokens = [t for d in lines for t in d["html"]["structure"]["tokens"]]
    assert summary["spanning_cells"] == tokens.count("<td") > 0
    assert any("colspan" in t for t in tokens) and any("rowspan" in t for t in tokens)
    for d in lines:
        structure, cells = d["html"]["structure"]["tokens"], d["html"]["cells"]
        assert structure[-1] == "</tbody>" and structure.count("<tr>") == structure.count("</tr>")
        assert structure.count("<td>") + structure.count("<td") == len(cells)


def test_boxes_are_tight_around_the_drawn_text(tables):
    root, _ = tables
    for d in _lines(root, "train"):
        img = cv2.imread(os.path.join(root, d["filename"]))
        dark = img.min(axis=2) < 200
        for cell in d["html"]["cells"]:
            if "bbox" not in cell:
                assert cell["tokens"] == []
                continue
            x1, y1, x2, y2 = cell["bbox"]
            assert 0 <= x1 < x2 <= img.shape[1] and 0 <= y1 < y2 <= img.shape[0] and cell["tokens"]
            box = dark[y1:y2, x1:x2]
            assert box[0].any() and box[-1].any() and box[:, 0].any() and box[:, -1].any()


def test_every_table_reaches_the_slanet_batch(tables):
    root, _ = tables
    fixture = importlib.util.spec_from_file_location(
        "fx", os.path.join(REPO, "tests", "fixtures", "paddle_table", "make_data_fixture.py")
    )
    fx = importlib.util.module_from_spec(fixture)
    fixture.loader.exec_module(fx)
    dataset = {
        "name": "PubTabDataSet",
        "data_dir": root,
        "label_file_list": [os.path.join(root, "train.txt")],
    }
    dataset["transforms"] = fx.PIPELINES["slanet"][0]
    ds = build_dataset({"Global": {"seed": 0}, "Eval": {"dataset": dataset}}, "Eval", "eval")
    for i in range(len(ds)):
        item = ds[i]
        assert not isinstance(item, BadSample), item
        assert item["image"].shape == (3, 488, 488) and item["bbox_masks"].sum() > 0
        assert 0 < item["bboxes"].max() <= 1.0


def test_same_seed_same_files_and_existing_data_is_kept(tables, tmp_path):
    root, _ = tables
    again = generate_table_dataset(str(tmp_path / "again"), num_train=10, num_val=3, seed=3, span_ratio=0.4)
    assert tree_digest(str(tmp_path / "again")) == tree_digest(root)
    assert again["spanning_cells"] > 0
    other = generate_table_dataset(str(tmp_path / "other"), num_train=10, num_val=3, seed=4, span_ratio=0.4)
    assert tree_digest(str(tmp_path / "other")) != tree_digest(root) and other["skipped"] is False
    assert generate_table_dataset(root, num_train=10, num_val=3, seed=9)["skipped"] is True
    with pytest.raises(SyntheticSettingError, match=r"max_rows must be a whole number in \[2, 30\], got 1"):
        generate_table_dataset(str(tmp_path / "bad"), num_train=1, num_val=1, max_rows=1)
    assert np.isfinite(again["seconds"])


def test_cell_sizes_set_the_rows_and_columns_and_are_checked(tmp_path):
    root = str(tmp_path / "tall")
    tool.main(
        ["table", "--out", root, "--num", "6", "--num_val", "1", "--cell_height", "40", "41"]
        + ["--cell_width", "50", "51", "--max_rows", "4", "--max_cols", "3"]
    )
    for d in _lines(root, "train"):
        height, width = cv2.imread(os.path.join(root, d["filename"])).shape[:2]
        tokens = d["html"]["structure"]["tokens"]
        rows = tokens.count("<tr>")
        cols = (tokens.count("<td>") + sum(int(t.split('"')[1]) for t in tokens if "colspan" in t)) // rows
        if not any("rowspan" in t for t in tokens):  # columns countable from the first row alone otherwise
            margin = height - 40 * rows
            assert width - 50 * cols == margin and 8 <= margin < 32
    for key, value, message in (
        (
            "cell_height",
            [30, 20],
            r"cell_height must be \[low, high\] in whole pixels with 16 <= low < high <= 400, got \[30, 20\]",
        ),
        ("cell_width", [10, 90], r"cell_width must be \[low, high\] in whole pixels with 24 <= low"),
        ("cell_height", [20], r"cell_height must be \[low, high\] in whole pixels"),
        ("cell_width", [36.0, 90], r"cell_width must be \[low, high\] in whole pixels"),
    ):
        with pytest.raises(SyntheticSettingError, match=message):
            generate_table_dataset(str(tmp_path / "bad"), num_train=1, num_val=1, **{key: value})


def test_ruling_lines_are_thick_and_spanning_text_is_centred():
    """The cues a downscaled table keeps: ruling lines 3 px thick (OpenCV thickness 2; a 1 px line
    can vanish in the resize to 160), and a spanning cell's text centred across the lines it
    spans (a cell beside an empty one would otherwise look the same but for one missing line)."""
    ruled = 0
    for seed in range(12):
        img, _ = render_table(np.random.default_rng(seed), 4, 4, 0.0)
        dark = (img.min(axis=2) < 100).sum(axis=1)  # per image row
        dark_rows = np.nonzero(dark > 0.9 * (img.shape[1] - 2 * 16))[0]  # lines span the table
        if len(dark_rows):
            ruled += 1
            runs = np.split(dark_rows, np.nonzero(np.diff(dark_rows) > 1)[0] + 1)
            assert {len(run) for run in runs} == {3}, (seed, runs)
    assert ruled >= 4
    canvas = np.full((60, 300, 3), 255, dtype=np.uint8)
    rng = np.random.default_rng(0)
    centres, starts = [], []
    for _ in range(20):
        cell = _draw_text(rng, canvas.copy(), (10, 5, 290, 55), (0, 0, 0), 0.4, 0.0, centred=True)
        centres.append((cell["bbox"][0] + cell["bbox"][2]) / 2)
        starts.append(_draw_text(rng, canvas.copy(), (10, 5, 290, 55), (0, 0, 0), 0.4, 0.0)["bbox"][0])
    assert max(abs(c - 150) for c in centres) <= 3
    assert max(starts) - min(starts) > 60
