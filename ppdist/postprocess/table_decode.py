"""SLANet decoding (PaddleOCR's ``TableLabelDecode``): structure tokens and cell boxes in image
coordinates, for the predictions and (when the batch holds them) the labels."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ppdist.data.charset import resolve_dict_path
from ppdist.postprocess.ctc_decode import best_path, to_numpy
from ppdist.registry import POSTPROCESSES

START, END = "sos", "eos"
MERGED_TD, OPEN_TD = "<td></td>", "<td>"
CELL_TOKENS = ("<td>", "<td", "<td></td>")  # the tokens whose step predicts a cell box


def load_table_tokens(character_dict_path: str, merge_no_span_structure: bool = False) -> List[str]:
    """The structure classes: ``sos``, the dictionary's tokens (one a line, kept as written but for
    the line end; with ``merge_no_span_structure`` ``<td></td>`` added and ``<td>`` removed), ``eos``."""
    with open(resolve_dict_path(character_dict_path), "rb") as f:
        tokens = [line.decode("utf-8").strip("\n").strip("\r\n") for line in f.readlines()]
    if merge_no_span_structure:
        if MERGED_TD not in tokens:
            tokens.append(MERGED_TD)
        if OPEN_TD in tokens:
            tokens.remove(OPEN_TD)
    return [START] + tokens + [END]


def decode_box(box: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """A normalised box (x, y, x, y, ...) in the original image's pixels: shape is (h, w, ...)."""
    box = np.array(box, dtype=np.float32)
    box[0::2] *= shape[1]
    box[1::2] *= shape[0]
    return box


@POSTPROCESSES.register(name="TableLabelDecode")
class TableLabelDecode:
    """``__call__(preds, batch) -> results``.

    ``preds``: ``structure_probs`` (B, L, C) probabilities and ``loc_preds`` (B, L, R) normalised
    boxes; ``batch["shape"]`` (B, 6): (h, w, ratio_h, ratio_w, pad_h, pad_w). Per sample the argmax
    tokens are read until ``eos`` (one at step 0 is skipped like ``sos``); a cell token
    (``<td>``, ``<td``, ``<td></td>``) keeps its step's box, scaled by (w, h).

    ``results``: ``structure_batch_list`` [[tokens, mean probability of the kept steps (nan when
    none)], ...] and ``bbox_batch_list`` [(n_cells, R) arrays]; with ``batch["structure"]`` and
    ``batch["bboxes"]`` also ``labels``: the same two lists for the labels (tokens only; every
    non-zero box of a kept step).
    """

    host_keys = ("structure", "bboxes", "shape")

    def __init__(self, character_dict_path: str, merge_no_span_structure: bool = False) -> None:
        self.character = load_table_tokens(character_dict_path, merge_no_span_structure)
        self.index = {token: i for i, token in enumerate(self.character)}
        self.end_idx = self.index[END]
        self.ignored = {self.index[START], self.end_idx}

    @property
    def num_classes(self) -> int:
        """The head's class count (``sos``, the tokens, ``eos``), as PaddleOCR's train.py reads it."""
        return len(self.character)

    def __call__(self, preds: Mapping[str, Any], batch: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        probs = preds["structure_probs"]
        shape_of = tuple(probs.shape)
        if len(shape_of) != 3 or shape_of[2] != len(self.character):
            raise ValueError(
                f"TableLabelDecode expects structure_probs (B, L, {len(self.character)}), got shape {shape_of}"
            )
        if batch is None or "shape" not in batch:
            raise ValueError("TableLabelDecode needs batch['shape'] (B, 6) to scale the boxes back")
        shapes = to_numpy(batch["shape"]).astype(np.float32)
        indices, scores = best_path(probs)
        results = self.decode(indices, scores, to_numpy(preds["loc_preds"]), shapes)
        if "structure" in batch and "bboxes" in batch:
            results["labels"] = self.decode_labels(
                to_numpy(batch["structure"]), to_numpy(batch["bboxes"]), shapes
            )
        return results

    def _kept_steps(self, row: np.ndarray) -> List[Tuple[int, int]]:
        """(step, index) of the tokens read from ``row``: up to an ``eos`` after step 0, without
        ``sos`` / ``eos``."""
        kept = []
        for step, index in enumerate(int(i) for i in row):
            if step > 0 and index == self.end_idx:
                break
            if index not in self.ignored:
                kept.append((step, index))
        return kept

    def decode(
        self, indices: np.ndarray, scores: np.ndarray, boxes: np.ndarray, shapes: np.ndarray
    ) -> Dict[str, Any]:
        """The predictions' token lists with their mean scores, and their cell boxes."""
        structures, box_lists = [], []
        for row, row_scores, row_boxes, shape in zip(indices, scores, boxes, shapes):
            kept = self._kept_steps(row)
            tokens = [self.character[i] for _, i in kept]
            cells = [decode_box(row_boxes[s], shape) for s, i in kept if self.character[i] in CELL_TOKENS]
            mean = float(np.mean([row_scores[s] for s, _ in kept])) if kept else float("nan")
            structures.append([tokens, mean])
            box_lists.append(np.array(cells, dtype=np.float32))
        return {"structure_batch_list": structures, "bbox_batch_list": box_lists}

    def decode_labels(self, structure: np.ndarray, boxes: np.ndarray, shapes: np.ndarray) -> Dict[str, Any]:
        """The labels' token lists and the boxes of their kept steps that are not all zero."""
        structures, box_lists = [], []
        for row, row_boxes, shape in zip(structure, boxes, shapes):
            kept = self._kept_steps(row)
            structures.append([self.character[i] for _, i in kept])
            box_lists.append([decode_box(row_boxes[s], shape) for s, _ in kept if row_boxes[s].sum() != 0])
        return {"structure_batch_list": structures, "bbox_batch_list": box_lists}
