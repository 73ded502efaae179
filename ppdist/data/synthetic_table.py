"""Synthetic tables in PubTabNet's jsonl layout (the table quick start's data).

``generate_table_dataset`` draws tables of random rows and columns, with row and column spans,
an optional header (``<thead>``), short cell texts (some cells empty) and all, only horizontal
or no ruling lines. Every structure can be read off its picture: the header rows are shaded,
only ruled tables (all lines) have spans and empty cells (without the lines neither can be seen),
the lines are thick enough to survive the downscale to SLANet's input, and a spanning cell's text
is centred across the lines it spans::

    out_dir/images/train/00000000.png   out_dir/train.txt   (one PubTabNet json object per line)
    out_dir/images/val/00000000.png     out_dir/val.txt

Each line is ``{"filename", "split", "imgid", "html": {"structure": {"tokens"}, "cells":
[{"tokens", "bbox"}]}}``: the structure tokens of PaddleOCR's ``table_structure_dict.txt``
(``<td>``/``</td>``, or ``<td``, `` colspan="n"``, `` rowspan="n"``, ``>``, ``</td>``), one
cell per ``<td``, its text as single characters and the tight box [x1, y1, x2, y2] of the drawn
text; an empty cell has no tokens and no bbox, as in PubTabNet.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence, Tuple

import cv2
import numpy as np

from ppdist.data.synthetic_io import build_atomically, check_setting, is_int
from ppdist.registry import SYNTHETIC_DATA
from ppdist.utils import strict_json

TEXT_CHARS = "ABCDEFGHKLMNPRSTXabcdefghkmnoprstuxyz0123456789.%-"
LINE_STYLES = ("full", "horizontal", "none")
MAX_SPAN = 3
EMPTY_CELLS = 0.15  # of a ruled table's cells
LINE_WIDTH = 2  # OpenCV thickness (3 px): ruling lines that survive a downscale to SLANet's input
FONT = cv2.FONT_HERSHEY_SIMPLEX
HEADER_SHADE = (150, 205)  # per channel, [low, high); the ink is 0-59
TEXT_COVERAGE = 73  # of 255: a text pixel in the cell box (darker than 200 on white for any ink)
CELL_HEIGHT = (20, 30)  # pixels, [low, high): PubTabNet-like short rows
CELL_WIDTH = (36, 90)


def _layout(
    rng: np.random.Generator, rows: int, cols: int, head: int, span_ratio: float
) -> List[Tuple[int, int, int, int]]:
    """Cells (row, col, rowspan, colspan) in row-major order covering the grid once; a row span
    stays inside the header or the body."""
    taken = np.zeros((rows, cols), dtype=bool)
    cells = []
    for r in range(rows):
        section_end = head if r < head else rows
        for c in range(cols):
            if taken[r, c]:
                continue
            rs = cs = 1
            if rng.random() < span_ratio:
                cs = int(rng.integers(1, MAX_SPAN + 1))
                rs = int(rng.integers(1, MAX_SPAN + 1))
                while c + cs > cols or taken[r, c : c + cs].any():
                    cs -= 1
                rs = min(rs, section_end - r)
                while taken[r : r + rs, c : c + cs].any():
                    rs -= 1
            taken[r : r + rs, c : c + cs] = True
            cells.append((r, c, rs, cs))
    return cells


def _cell_tokens(rs: int, cs: int) -> List[str]:
    if rs == 1 and cs == 1:
        return ["<td>", "</td>"]
    attrs = ([f' colspan="{cs}"'] if cs > 1 else []) + ([f' rowspan="{rs}"'] if rs > 1 else [])
    return ["<td", *attrs, ">", "</td>"]


def render_table(
    rng: np.random.Generator,
    max_rows: int,
    max_cols: int,
    span_ratio: float,
    cell_height: Tuple[int, int] = CELL_HEIGHT,
    cell_width: Tuple[int, int] = CELL_WIDTH,
) -> Tuple[np.ndarray, Dict[str, Any]]:
    """One table picture (uint8 BGR) and its PubTabNet ``html`` entry; each row's height and each
    column's width drawn from ``cell_height`` / ``cell_width`` ([low, high) pixels)."""
    rows, cols = int(rng.integers(2, max_rows + 1)), int(rng.integers(2, max_cols + 1))
    head = int(rng.random() < 0.5)
    widths = rng.integers(cell_width[0], cell_width[1], size=cols)
    heights = rng.integers(cell_height[0], cell_height[1], size=rows)
    margin = int(rng.integers(4, 16))
    xs = np.concatenate([[0], np.cumsum(widths)]) + margin
    ys = np.concatenate([[0], np.cumsum(heights)]) + margin
    img = np.full((int(ys[-1]) + margin, int(xs[-1]) + margin, 3), 255, dtype=np.uint8)
    ink = tuple(int(v) for v in rng.integers(0, 60, size=3))
    lines = LINE_STYLES[int(rng.integers(len(LINE_STYLES)))]
    scale = float(rng.uniform(0.35, 0.45))
    ruled = lines == "full"
    layout = _layout(rng, rows, cols, head, span_ratio if ruled else 0.0)
    if head:  # a shaded header, plainly darker than the body (the text stays darker still)
        shade = tuple(int(v) for v in rng.integers(HEADER_SHADE[0], HEADER_SHADE[1], size=3))
        cv2.rectangle(img, (int(xs[0]), int(ys[0])), (int(xs[-1]), int(ys[head])), shade, -1)
    structure: List[str] = ["<thead>"] if head else ["<tbody>"]
    cells: List[Dict[str, Any]] = []
    for r in range(rows):
        if head and r == head:
            structure += ["</thead>", "<tbody>"]
        structure.append("<tr>")
        for _, c, rs, cs in (cell for cell in layout if cell[0] == r):
            structure += _cell_tokens(rs, cs)
            x1, x2, y1, y2 = int(xs[c]), int(xs[c + cs]), int(ys[r]), int(ys[r + rs])
            if lines == "full":
                cv2.rectangle(img, (x1, y1), (x2, y2), ink, LINE_WIDTH)
            empty = EMPTY_CELLS if ruled else 0.0
            cells.append(_draw_text(rng, img, (x1, y1, x2, y2), ink, scale, empty, centred=rs > 1 or cs > 1))
        structure.append("</tr>")
    structure.append("</tbody>")
    if lines == "horizontal":
        for y in ys[[0, head, rows]] if head else ys[[0, rows]]:
            cv2.line(img, (int(xs[0]), int(y)), (int(xs[-1]), int(y)), ink, LINE_WIDTH)
    return img, {"structure": {"tokens": structure}, "cells": cells}


def _draw_text(
    rng: np.random.Generator,
    img: np.ndarray,
    box: Tuple[int, int, int, int],
    ink: tuple,
    scale: float,
    empty: float,
    centred: bool = False,
) -> Dict[str, Any]:
    """Draw a short text inside ``box`` (or, with probability ``empty``, nothing); its cell entry.
    The text starts at a random place in the row, or is centred (a spanning cell's, as tables set
    them: across the lines it spans)."""
    x1, y1, x2, y2 = box
    if rng.random() < empty:
        return {"tokens": []}
    length = int(rng.integers(1, 8))
    while length > 1 and cv2.getTextSize("W" * length, FONT, scale, 1)[0][0] > x2 - x1 - 8:
        length -= 1
    text = "".join(TEXT_CHARS[i] for i in rng.integers(0, len(TEXT_CHARS), size=length))
    (w, h), base = cv2.getTextSize(text, FONT, scale, 1)
    offset = int(rng.integers(0, max(1, x2 - x1 - 8 - w)))
    left = x1 + max(4, (x2 - x1 - w) // 2) if centred else x1 + 4 + offset
    bottom = y1 + (y2 - y1 + h) // 2
    cv2.putText(img, text, (left, bottom), FONT, scale, ink, 1, cv2.LINE_AA)
    coverage = np.zeros(img.shape[:2], dtype=np.uint8)  # the text alone, whatever the background
    cv2.putText(coverage, text, (left, bottom), FONT, scale, 255, 1, cv2.LINE_AA)
    yy, xx = np.nonzero(coverage[y1 + 2 : y2 - 1, x1 + 2 : x2 - 1] >= TEXT_COVERAGE)
    if len(xx) == 0:
        return {"tokens": []}
    bbox = [x1 + 2 + int(xx.min()), y1 + 2 + int(yy.min()), x1 + 3 + int(xx.max()), y1 + 3 + int(yy.max())]
    return {"tokens": list(text), "bbox": bbox}


def _write_split(
    root: str,
    split: str,
    count: int,
    seed: int,
    split_id: int,
    max_rows: int,
    max_cols: int,
    span_ratio: float,
    cell_height: Tuple[int, int],
    cell_width: Tuple[int, int],
) -> int:
    os.makedirs(os.path.join(root, "images", split))
    spans = 0
    with open(os.path.join(root, f"{split}.txt"), "w", encoding="utf-8", newline="\n") as handle:
        for i in range(count):
            rng = np.random.default_rng([seed & 0xFFFFFFFF, split_id, i])
            img, html = render_table(rng, max_rows, max_cols, span_ratio, cell_height, cell_width)
            rel = f"images/{split}/{i:08d}.png"
            ok, buf = cv2.imencode(".png", img)
            if not ok:
                raise RuntimeError(f"could not encode {rel}")
            with open(os.path.join(root, rel), "wb") as out:
                out.write(buf.tobytes())
            spans += html["structure"]["tokens"].count("<td")
            handle.write(
                strict_json.dumps({"filename": rel, "split": split, "imgid": i, "html": html}) + "\n"
            )
    return spans


def _pixel_range(key: str, value: Sequence[int], smallest: int) -> Tuple[int, int]:
    """``value`` as a (low, high) pair of integers with ``smallest <= low < high <= 400``."""
    pair = tuple(value) if isinstance(value, (list, tuple)) else ()
    expected = f"[low, high] in whole pixels with {smallest} <= low < high <= 400"
    check_setting(len(pair) == 2 and all(is_int(v) for v in pair), key, expected, value)
    low, high = pair
    check_setting(smallest <= low < high <= 400, key, expected, value)
    return low, high


@SYNTHETIC_DATA.register(name="table")
def generate_table_dataset(
    out_dir: str,
    num_train: int,
    num_val: int,
    seed: int = 0,
    max_rows: int = 8,
    max_cols: int = 6,
    span_ratio: float = 0.15,
    cell_height: Sequence[int] = CELL_HEIGHT,
    cell_width: Sequence[int] = CELL_WIDTH,
) -> dict:
    """Draw a table dataset into ``out_dir`` (skipped if ``out_dir/train.txt`` exists).

    ``cell_height`` / ``cell_width``: the [low, high) pixel ranges of the rows' heights and the
    columns' widths (the defaults give PubTabNet-like wide tables of short rows; taller rows are
    easier to tell apart at SLANet's stride-32 attention). Deterministic for a seed; train and val
    use separate random streams. Built in a temporary directory beside ``out_dir`` and renamed into
    place. Returns a summary dict.
    """
    check_setting(is_int(max_rows) and 2 <= max_rows <= 30, "max_rows", "a whole number in [2, 30]", max_rows)
    check_setting(is_int(max_cols) and 2 <= max_cols <= 20, "max_cols", "a whole number in [2, 20]", max_cols)
    check_setting(
        isinstance(span_ratio, (int, float)) and 0.0 <= span_ratio <= 1.0,
        "span_ratio",
        "in [0, 1]",
        span_ratio,
    )
    cell_height = _pixel_range("cell_height", cell_height, 16)
    cell_width = _pixel_range("cell_width", cell_width, 24)
    out_dir = os.path.abspath(out_dir)
    summary: Dict[str, object] = {
        "task": "table",
        "out_dir": out_dir,
        "seed": seed,
        "max_rows": max_rows,
        "max_cols": max_cols,
        "span_ratio": span_ratio,
        "cell_height": list(cell_height),
        "cell_width": list(cell_width),
    }

    def write(tmp: str) -> dict:
        args = (max_rows, max_cols, span_ratio, cell_height, cell_width)
        spans = _write_split(tmp, "train", num_train, seed, 0, *args)
        spans += _write_split(tmp, "val", num_val, seed, 1, *args)
        return {"spanning_cells": spans}

    settings = {
        key: summary[key]
        for key in ("seed", "max_rows", "max_cols", "span_ratio", "cell_height", "cell_width")
    }
    return build_atomically(out_dir, summary, num_train, num_val, write, settings)
