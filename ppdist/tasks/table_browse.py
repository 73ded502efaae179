"""Tables in ``tools/browse_dataset.py``: a sample's structure tokens decoded back, its grid (rows,
columns, cells, spanning cells), its cell boxes in the drawn image's pixels, and the split's table
numbers for the summary (``ppdist.browse.dataset_browser`` calls these for ``model_type: table``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ppdist.data.transforms.table import CELL_TOKENS, TableBoxEncode, TableLabelEncode

_SPAN = re.compile(r'\s*(rowspan|colspan)="?(\d+)"?')
LENGTH_BIN = 10  # structure lengths and cells per table are counted in bins of this width


@dataclass(frozen=True)
class TableGrid:
    """What a structure describes: ``rows`` (``<tr>``), ``cols`` (the widest row, spans included),
    ``cells`` and ``spanning`` (cells with a rowspan or colspan above 1)."""

    rows: int
    cols: int
    cells: int
    spanning: int


def table_grid(tokens: Sequence[str]) -> TableGrid:
    """The grid of HTML structure tokens (``<td></td>`` merged or not; `` colspan="n"`` /
    `` rowspan="n"`` after a ``<td``): columns laid out as a browser does, a row span taking its
    columns in the rows below."""
    occupied: Dict[int, set] = {}  # row -> columns taken by row spans from above
    row, column, width, cells, spanning = -1, 0, 0, 0, 0
    span: Optional[Dict[str, int]] = None

    def place(spans: Mapping[str, int]) -> None:
        nonlocal column, width, cells, spanning
        taken = occupied.setdefault(row, set())
        while column in taken:
            column += 1
        rs, cs = max(1, spans.get("rowspan", 1)), max(1, spans.get("colspan", 1))
        for r in range(row, row + rs):
            occupied.setdefault(r, set()).update(range(column, column + cs))
        column += cs
        width = max(width, column)
        cells += 1
        spanning += int(rs > 1 or cs > 1)

    for token in tokens:
        if token == "<tr>":
            row, column = row + 1, 0
        elif token == "<td":  # its attributes follow, up to ">"
            span = {}
        elif span is not None and _SPAN.fullmatch(token):
            name, value = _SPAN.fullmatch(token).groups()
            span[name] = int(value)
        elif span is not None and token == ">":
            place(span)
            span = None
        elif token in CELL_TOKENS and row >= 0:  # <td>, <td></td>, <eb></eb>
            place({})
    return TableGrid(row + 1, width, cells, spanning)


def find_op(ops: Sequence[Any], kind: type) -> Optional[Any]:
    """The first transform of ``kind`` in a dataset's ``ops``, or None."""
    return next((op for op in ops if isinstance(op, kind)), None)


def raw_structure_length(
    encoder: Optional[TableLabelEncode], raw: Optional[Mapping[str, Any]]
) -> Optional[int]:
    """The tokens ``TableLabelEncode`` would encode for a raw sample (spans and ``<td></td>`` merged
    as configured), before its ``max_text_length`` check; None without encoder or raw sample."""
    if encoder is None or raw is None:
        return None
    return len(encoder.tokens(dict(raw)))


def structure_tokens(structure: np.ndarray, length: int, character: Sequence[str]) -> List[str]:
    """An encoded ``structure`` (sos, ``length`` tokens, eos, padding) as its tokens."""
    return [character[int(i)] for i in np.asarray(structure).reshape(-1)[1 : 1 + int(length)]]


def cell_boxes(
    bboxes: np.ndarray, masks: np.ndarray, shape: np.ndarray, box_format: str = "xyxy"
) -> np.ndarray:
    """The learned cell boxes (``bbox_masks`` > 0) of a batch sample in the pixels of its padded
    image: normalised by the original width / height (``TableBoxEncode``), scaled by the original
    size times the resize ratio (``shape``: h, w, ratio_h, ratio_w, ...). xywh comes back as xyxy;
    (N, 4), or (N, 8) polygons for xyxyxyxy."""
    boxes = np.asarray(bboxes, np.float32).reshape(len(masks), -1)[np.asarray(masks) > 0].copy()
    h, w, ratio_h, ratio_w = (float(v) for v in np.asarray(shape).reshape(-1)[:4])
    boxes[:, 0::2] *= w * ratio_w
    boxes[:, 1::2] *= h * ratio_h
    if box_format == "xywh":
        cx, cy, bw, bh = boxes.T
        boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1)
    return boxes


def out_box_format(ops: Sequence[Any]) -> str:
    """The box format the pipeline's ``TableBoxEncode`` writes (xyxy without one)."""
    op = find_op(ops, TableBoxEncode)
    return op.out_box_format if op is not None else "xyxy"


def binned(values: Sequence[int], width: int = LENGTH_BIN) -> Dict[str, int]:
    """Counts of ``values`` in bins ``"a-b"`` of ``width`` (in increasing order)."""
    counts = Counter(int(v) // width for v in values)
    return {f"{b * width}-{b * width + width - 1}": n for b, n in sorted(counts.items())}


def table_summary(
    grids: Sequence[TableGrid],
    lengths: Sequence[int],
    raw_lengths: Sequence[int],
    max_text_length: Optional[int],
) -> Dict[str, Any]:
    """The summary's table numbers: rows, columns (exact), cells per table and structure lengths
    (bins of ``LENGTH_BIN``) of the drawn / counted samples; spanning cells; and of every sample
    read (bad ones too) how many have more tokens than ``max_text_length``, which
    ``TableLabelEncode`` rejects."""
    out: Dict[str, Any] = {
        "tables": len(grids),
        "cells": sum(g.cells for g in grids),
        "spanning_cells": sum(g.spanning for g in grids),
        "tables_with_spans": sum(g.spanning > 0 for g in grids),
        "max_text_length": max_text_length,
        "longer_than_max_text_length": (
            sum(n > max_text_length for n in raw_lengths) if max_text_length is not None else None
        ),
        "longest_structure": max(raw_lengths) if raw_lengths else None,
        "structure_lengths": binned(lengths),
        "rows": dict(sorted(Counter(g.rows for g in grids).items())),
        "columns": dict(sorted(Counter(g.cols for g in grids).items())),
        "cells_per_table": binned([g.cells for g in grids]),
    }
    return out


def caption(tokens: Sequence[str], grid: TableGrid, limit: int = 60) -> str:
    """A panel's caption: the grid's numbers, then the structure (cut at ``limit`` characters)."""
    text = "".join(t for t in tokens if t not in ("<thead>", "</thead>", "<tbody>", "</tbody>"))
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    head = (
        f"{grid.rows}x{grid.cols}, {grid.cells} cells"
        + (f" ({grid.spanning} spanning)" if grid.spanning else "")
        + f", {len(tokens)} tokens"
    )
    return f"{head}\n{text}"
