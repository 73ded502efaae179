"""tools/browse_dataset.py on tables: each sample's learned cell boxes in the drawn image, its grid
as caption, and the split's table numbers (rows, columns, cells, spans, structure lengths, tables the
encoder drops for their length)."""

import json
import os

import numpy as np
import pytest
from picture_testing import assert_picture
from PIL import Image
from ppdist_testing import tiny_table_config

from ppdist.browse.browse import BrowseOptions, browse_dataset
from ppdist.browse.dataset_browser import read_samples, split_dataset, summarize
from ppdist.browse.sample_grid import cell_colour, render_samples
from ppdist.config import load_config
from ppdist.data.synthetic_table import generate_table_dataset
from ppdist.data.transforms.table import merge_no_span
from ppdist.tasks.table_browse import TableGrid, caption, cell_boxes, table_grid

SIZE = 160


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    generate_table_dataset(str(root / "data"), num_train=6, num_val=6, seed=5, max_rows=4, max_cols=4)
    path = tiny_table_config(str(root / "t.yml"), str(root / "data"), str(root / "out"), size=SIZE)
    return root, path


def jsonl(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_the_grid_counts_rows_columns_cells_and_spans():
    tokens = ["<thead>", "<tr>", "<td", ' colspan="2"', ">", "</td>", "<td></td>", "</tr>", "</thead>"]
    tokens += ["<tbody>", "<tr>", "<td", ' rowspan="2"', ">", "</td>", "<td></td>", "<td></td>", "</tr>"]
    tokens += ["<tr>", "<td></td>", "<td></td>", "</tr>", "</tbody>"]
    assert table_grid(tokens) == TableGrid(rows=3, cols=3, cells=7, spanning=2)
    unmerged = ["<tr>", "<td>", "</td>", "<td>", "</td>", "</tr>", "<tr>", "<td>", "</td>", "</tr>"]
    assert table_grid(unmerged) == TableGrid(rows=2, cols=2, cells=3, spanning=0)
    assert caption(unmerged, table_grid(unmerged)).splitlines() == [
        "2x2, 3 cells, 10 tokens",
        "<tr><td></td><td></td></tr><tr><td></td></tr>",
    ]


def test_cell_boxes_scale_back_xywh_and_polygons():
    shape = np.array([100, 200, 0.5, 0.5, 160, 160], np.float32)  # h, w, ratio_h, ratio_w, padded
    masks = np.array([0, 1, 0, 1], np.float32)
    xywh = np.array([[0, 0, 0, 0], [0.5, 0.5, 0.2, 0.4], [0, 0, 0, 0], [0.1, 0.2, 0.1, 0.2]], np.float32)
    np.testing.assert_allclose(
        cell_boxes(xywh, masks, shape, "xywh"), [[40.0, 15.0, 60.0, 35.0], [5.0, 5.0, 15.0, 15.0]], atol=1e-5
    )
    quad = np.zeros((4, 8), np.float32)
    quad[1] = [0.1, 0.2, 0.3, 0.2, 0.3, 0.4, 0.1, 0.4]
    np.testing.assert_allclose(
        cell_boxes(quad, masks, shape, "xyxyxyxy")[0], [10, 10, 30, 10, 30, 20, 10, 20], atol=1e-5
    )


def test_cell_boxes_are_the_labels_in_the_drawn_image_and_the_summary_counts_the_tables(tables):
    root, path = tables
    config = load_config(path, [])
    dataset = split_dataset(config, "Eval")
    browse = read_samples(config, "Eval", dataset, range(6))
    lines = jsonl(root / "data" / "val.txt")
    grids = []
    for sample, line in zip(browse.samples, lines):
        width, height = Image.open(root / "data" / line["filename"]).size
        scale = SIZE / max(width, height)  # ResizeTableImage to a longest side of SIZE, padded
        expected = np.array([c["bbox"] for c in line["html"]["cells"] if c["tokens"]], np.float32) * scale
        assert sample.size == (SIZE, SIZE)
        np.testing.assert_allclose(sample.boxes, expected, atol=0.02)
        tokens = merge_no_span(line["html"]["structure"]["tokens"])
        assert sample.structure == tokens
        rows = tokens.count("<tr>")
        cells = len(line["html"]["cells"])
        spanning = sum("span" in t for t in tokens) - sum(
            ' colspan="' in a and ' rowspan="' in b for a, b in zip(tokens, tokens[1:])
        )
        assert (sample.grid.rows, sample.grid.cells, sample.grid.spanning) == (rows, cells, spanning)
        grids.append(sample.grid)
    summary = summarize(browse)
    assert summary["tables"] == 6 and summary["cells"] == sum(len(x["html"]["cells"]) for x in lines)
    assert summary["rows"] == {r: sum(g.rows == r for g in grids) for r in {g.rows for g in grids}}
    assert sum(summary["columns"].values()) == sum(summary["cells_per_table"].values()) == 6
    lengths = [len(merge_no_span(x["html"]["structure"]["tokens"])) for x in lines]
    assert summary["longest_structure"] == max(lengths) and summary["longer_than_max_text_length"] == 0
    assert sum(summary["structure_lengths"].values()) == 6

    # the box drawn where it is: the left, right and bottom sides of the largest cell in its colour
    sample = browse.samples[0]
    figure = render_samples(browse, [sample])
    picture = str(root / "one.png")
    figure.savefig(picture, dpi=figure.dpi)
    drawn = np.asarray(Image.open(picture).convert("RGB")).astype(int)
    axes, height = figure.axes[0], figure.canvas.get_width_height()[1]
    biggest = int(np.argmax(np.prod(sample.boxes[:, 2:] - sample.boxes[:, :2], axis=1)))
    x1, y1, x2, y2 = sample.boxes[biggest]
    colour = np.array(cell_colour(biggest)) * 255
    for x, y in ((x1, (y1 + y2) / 2), (x2, (y1 + y2) / 2), ((x1 + x2) / 2, y2)):
        px, py = axes.transData.transform((x, y))
        patch = drawn[int(height - py) - 1 : int(height - py) + 2, int(px) - 1 : int(px) + 2]
        assert np.abs(patch - colour).sum(axis=-1).min() < 40, (x, y, patch)
    assert axes.get_title().startswith(f"#0 {SIZE}x{SIZE}, {sample.grid.rows}x{sample.grid.cols}, ")


def test_tables_longer_than_max_text_length_are_counted_as_dropped(tables):
    root, path = tables
    config = load_config(path, ["Global.max_text_length=20"])
    out = str(root / "browse")
    summary = browse_dataset(config, BrowseOptions("Eval", num=6, out_dir=out))
    lengths = [len(merge_no_span(x["html"]["structure"]["tokens"])) for x in jsonl(root / "data" / "val.txt")]
    dropped = sum(n > 20 for n in lengths)
    assert 0 < dropped < 6
    assert summary["longer_than_max_text_length"] == dropped == len(summary["bad_samples"])
    assert all("max_text_length 20" in bad for bad in summary["bad_samples"])
    assert summary["tables"] == summary["samples_counted"] == 6 - dropped
    assert summary["max_text_length"] == 20 and summary["longest_structure"] == max(lengths)
    assert "longer than max text length" in open(os.path.join(out, "summary.md"), encoding="utf-8").read()
    assert_picture(summary["pictures"][0], (3 * 400, 440 * ((6 - dropped + 2) // 3)))
