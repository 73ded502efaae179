"""Table recognition metric (PaddleOCR's ``TableMetric``): structure accuracy, optionally the cell
boxes' precision / recall / hmean (``compute_bbox_metric``) and the structure TEDS (``teds``)."""

from __future__ import annotations

import heapq
import math
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence

import numpy as np
from rapidfuzz.distance import Levenshtein

from ppdist.data.base import SAMPLE_INDEX_KEY
from ppdist.errors import ConfigError
from ppdist.metrics.base import Metric
from ppdist.metrics.polygon_match import MatchCounts, Point, match_counts
from ppdist.metrics.report import (
    AccuracyByLength,
    ReportItem,
    TablesGallery,
    TextFile,
    dataset_image,
    markdown_table,
    sample_origin,
)
from ppdist.metrics.teds import TEDS, structure_html
from ppdist.registry import METRICS

EPS = 1e-6
BOX_WIDTHS = {"xyxy": 4, "xywh": 4, "xyxyxyxy": 8}
BOX_FORMATS = tuple(BOX_WIDTHS)
SECTION_TAGS = ("<thead>", "</thead>", "<tbody>", "</tbody>")
GALLERY_SIZE = 9  # wrong tables kept (per process, then merged) and drawn by ``report``
LENGTH_BIN = 10  # structure lengths are grouped in bins of this width (wider for long tables)


class TableMistake(NamedTuple):
    """A table whose structure is wrong: its ``similarity`` to the label (structure TEDS with
    ``teds``, else 1 - the normalised edit distance of the token lists), dataset index (-1:
    unknown), predicted / labelled tokens and cell boxes (image pixels)."""

    similarity: float
    index: int
    pred: List[str]
    label: List[str]
    pred_boxes: List[List[float]]
    label_boxes: List[List[float]]


def box_polygon(box: Any, box_format: str) -> List[Point]:
    """The four corners of a box in ``box_format`` (xywh: centre and size, halves floored)."""
    box = np.asarray(box)
    if box_format == "xyxyxyxy":
        corners = box.reshape(4, 2)
    else:
        if box_format == "xywh":
            x, y, w, h = box
            box = np.array([x - w // 2, y - h // 2, x + w // 2, y + h // 2])
        x1, y1, x2, y2 = box
        corners = np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]])
    return [(float(x), float(y)) for x, y in corners]


def box_scores(gt: int, det: int, matched: int) -> Dict[str, float]:
    """DetMetric's combined precision, recall and hmean of the summed counts."""
    recall = matched / gt if gt else 0.0
    precision = matched / det if det else 0.0
    hmean = 2 * recall * precision / (recall + precision) if recall + precision else 0.0
    return {"precision": precision, "recall": recall, "hmean": hmean}


def check_metric_options(options: Mapping[str, Any], where: str = "Metric") -> None:
    """The values TableMetric refuses, as one ``ConfigError`` naming the key."""
    box_format = options.get("box_format", "xyxy")
    compute_bbox_metric = bool(options.get("compute_bbox_metric", False))
    loc_reg_num, main_indicator = options.get("loc_reg_num"), options.get("main_indicator", "acc")
    if box_format not in BOX_FORMATS:
        raise ConfigError(f"{where}.box_format: expected one of {BOX_FORMATS}, got {box_format!r}")
    width = BOX_WIDTHS[box_format]
    if compute_bbox_metric and loc_reg_num is not None and loc_reg_num != width:
        raise ConfigError(
            f"{where}.loc_reg_num: box_format {box_format} has {width} coordinates, got loc_reg_num {loc_reg_num}"
        )
    allowed = (
        ("acc",) + (("hmean",) if compute_bbox_metric else ()) + (("teds",) if options.get("teds") else ())
    )
    if main_indicator not in allowed:
        raise ConfigError(
            f"{where}.main_indicator: expected one of {allowed} (hmean needs compute_bbox_metric: true, "
            f"teds needs teds: true), got {main_indicator!r}"
        )


@METRICS.register(name="TableMetric")
class TableMetric(Metric):
    """``update(results, batch)`` with TableLabelDecode's results (``labels`` included).

    ``acc``: the share of tables whose joined structure tokens equal the label's (``<thead>``,
    ``<tbody>`` and their ends removed from both with ``del_thead_tbody``), as correct / (n + 1e-6).
    ``compute_bbox_metric``: cell boxes matched as DetMetric (IoU > 0.5), reported as
    ``bbox_metric_precision`` / ``_recall`` / ``_hmean``; with ``main_indicator: hmean`` those are
    ``precision`` / ``recall`` / ``hmean`` and the accuracy ``structure_metric_acc`` (Paddle's keys).
    ``teds``: the mean structure-only TEDS of predicted vs label HTML (``teds``; may be the main
    indicator). ``loc_reg_num`` (SLANet.yml passes it; PaddleOCR ignores it) must match
    ``box_format``'s coordinate count when boxes are scored. The state is integer counts and the
    per-sample TEDS (summed with ``math.fsum``), so merged states give exactly the single-process
    numbers. ``compute`` does not reset. For ``pictures`` it also keeps each table's (index,
    labelled length, correct, TEDS) and its ``GALLERY_SIZE`` worst wrong tables (lowest similarity,
    then index: the merged processes' worst are exactly the single process's).
    """

    def __init__(
        self,
        main_indicator: str = "acc",
        compute_bbox_metric: bool = False,
        box_format: str = "xyxy",
        del_thead_tbody: bool = False,
        teds: bool = False,
        loc_reg_num: Optional[int] = None,
    ) -> None:
        check_metric_options(
            {
                "main_indicator": main_indicator,
                "compute_bbox_metric": compute_bbox_metric,
                "box_format": box_format,
                "teds": teds,
                "loc_reg_num": loc_reg_num,
            }
        )
        self.main_indicator = main_indicator
        self.compute_bbox_metric = bool(compute_bbox_metric)
        self.box_format = box_format
        self.del_thead_tbody = bool(del_thead_tbody)
        self.teds = TEDS(structure_only=True) if teds else None
        self.dataset: Any = None
        self.reset()

    def bind_dataset(self, dataset: Any) -> None:
        """The eval dataset (called by the evaluator): ``pictures`` reads the worst tables' images
        from it by their ``_sample_index``."""
        self.dataset = dataset

    @staticmethod
    def check_values(options: Mapping[str, Any], where: str) -> None:
        """Config validation: the values ``__init__`` would refuse."""
        check_metric_options(options, where)

    def reset(self) -> None:
        self.correct_num = 0
        self.all_num = 0
        self.box_counts = MatchCounts(0, 0, 0)
        self.teds_scores: List[float] = []
        self.records: List[tuple] = []  # (index, labelled length, correct, teds or None) per table
        self.mistakes: List[TableMistake] = []  # the GALLERY_SIZE worst wrong tables

    def _structure_text(self, tokens: Sequence[str]) -> str:
        text = "".join(tokens)
        if self.del_thead_tbody:
            for tag in SECTION_TAGS:
                text = text.replace(tag, "")
        return text

    def update(self, results: Mapping[str, Any], batch: Optional[Mapping[str, Any]] = None) -> None:
        labels = results.get("labels")
        if labels is None:
            raise ValueError(
                "TableMetric needs the labels' decode (TableLabelDecode with batch structure/bboxes)"
            )
        preds, gts = results["structure_batch_list"], labels["structure_batch_list"]
        if len(preds) != len(gts):
            raise ValueError(f"TableMetric: {len(preds)} predictions for {len(gts)} labels")
        indices = batch.get(SAMPLE_INDEX_KEY) if batch is not None else None
        indices = [int(i) for i in indices] if indices is not None else [-1] * len(preds)
        for k, ((pred, _score), gt) in enumerate(zip(preds, gts)):
            correct = self._structure_text(pred) == self._structure_text(gt)
            self.correct_num += int(correct)
            self.all_num += 1
            teds = None
            if self.teds is not None:
                teds = self.teds.evaluate(structure_html(pred), structure_html(gt))
                self.teds_scores.append(teds)
            self.records.append((indices[k], len(gt), int(correct), teds))
            if not correct:
                similarity = teds if teds is not None else 1.0 - Levenshtein.normalized_distance(pred, gt)
                if self._among_worst(float(similarity), indices[k]):  # boxes copied for the kept ones only
                    boxes = (
                        _box_list(results["bbox_batch_list"][k]),
                        _box_list(labels["bbox_batch_list"][k]),
                    )
                    self._keep_worst(
                        [TableMistake(float(similarity), indices[k], list(pred), list(gt), *boxes)]
                    )
        if self.compute_bbox_metric:
            for pred_boxes, gt_boxes in zip(results["bbox_batch_list"], labels["bbox_batch_list"]):
                counts = match_counts(
                    [box_polygon(b, self.box_format) for b in gt_boxes],
                    [box_polygon(b, self.box_format) for b in pred_boxes],
                )
                self.box_counts = MatchCounts(*(a + b for a, b in zip(self.box_counts, counts)))

    def _among_worst(self, similarity: float, index: int) -> bool:
        """Whether a wrong table of this similarity and index enters the kept worst ones."""
        if len(self.mistakes) < GALLERY_SIZE:
            return True
        last = self.mistakes[-1]
        return (similarity, index) < (last.similarity, last.index)

    def _keep_worst(self, mistakes: Sequence[TableMistake]) -> None:
        self.mistakes = heapq.nsmallest(
            GALLERY_SIZE, list(self.mistakes) + list(mistakes), key=lambda m: (m.similarity, m.index)
        )

    def state(self) -> Dict[str, Any]:
        return {
            "correct_num": self.correct_num,
            "all_num": self.all_num,
            "box_counts": list(self.box_counts),
            "teds_scores": list(self.teds_scores),
            "records": list(self.records),
            "mistakes": [tuple(m) for m in self.mistakes],
        }

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        self.reset()
        for part in states:
            self.correct_num += int(part["correct_num"])
            self.all_num += int(part["all_num"])
            self.box_counts = MatchCounts(*(a + int(b) for a, b in zip(self.box_counts, part["box_counts"])))
            self.teds_scores.extend(float(s) for s in part["teds_scores"])
            self.records.extend(tuple(r) for r in part.get("records", []))
            self._keep_worst([TableMistake(*m) for m in part.get("mistakes", [])])

    def compute(self) -> Dict[str, float]:
        self.nothing_evaluated = None if self.all_num else "no table was evaluated"
        acc = self.correct_num / (self.all_num + EPS) if self.all_num else math.nan
        out: Dict[str, float] = {"acc": acc}
        if self.compute_bbox_metric:
            boxes = box_scores(*self.box_counts)
            if self.main_indicator == "hmean":
                out = dict(boxes, structure_metric_acc=acc)
            else:
                out.update({f"bbox_metric_{k}": v for k, v in boxes.items()})
        if self.teds is not None:
            out["teds"] = (
                math.fsum(self.teds_scores) / len(self.teds_scores) if self.teds_scores else math.nan
            )
        return out

    def report(self) -> List[ReportItem]:
        """``worst_tables.png`` (the ``GALLERY_SIZE`` wrong tables of lowest similarity, their images
        read again from the bound dataset, with predicted and labelled cell boxes) and
        ``worst_tables.md`` (their tokens and origins) when a structure is wrong;
        ``accuracy_by_length.png`` / ``.md`` (accuracy and mean TEDS per bin of labelled length)."""
        items: List[ReportItem] = []
        name = "TEDS" if self.teds is not None else "token similarity"
        if self.mistakes:
            tables = []
            for n, m in enumerate(self.mistakes):
                title = (
                    f"{n + 1}. {name} {m.similarity:.3f}, label {len(m.label)} / predicted {len(m.pred)} tokens\n"
                    f"{_short(sample_origin(self.dataset, m.index))}"
                )
                tables.append(
                    dict(
                        image=dataset_image(self.dataset, m.index),
                        pred_boxes=m.pred_boxes,
                        label_boxes=m.label_boxes,
                        title=title,
                    )
                )
            rows = [
                (
                    n + 1,
                    f"{m.similarity:.4f}",
                    _tokens(m.label),
                    _tokens(m.pred),
                    sample_origin(self.dataset, m.index),
                )
                for n, m in enumerate(self.mistakes)
            ]
            wrong = self.all_num - self.correct_num
            title = (
                f"The {len(rows)} worst of {wrong} wrong structure(s) in {self.all_num} table(s) "
                "(red: predicted cells, green dashed: labelled cells in worst_tables.png)"
            )
            listing = markdown_table(["#", name, "label", "prediction", "sample"], rows, title)
            items += [TablesGallery("worst_tables.png", tables), TextFile("worst_tables.md", listing)]
        by_length = accuracy_by_length(self.records)
        if by_length:
            header = ["labelled length", "tables", "correct", "acc", "mean TEDS"]
            rows = [
                (
                    r["lengths"],
                    r["tables"],
                    r["correct"],
                    f"{r['acc']:.4f}",
                    "" if r["teds"] is None else f"{r['teds']:.4f}",
                )
                for r in by_length
            ]
            text = markdown_table(header, rows, "Structure accuracy by labelled structure length")
            items += [
                AccuracyByLength("accuracy_by_length.png", by_length),
                TextFile("accuracy_by_length.md", text),
            ]
        return items


def length_bin_width(longest: int, bins: int = 25) -> int:
    """The width of the length bins: ``LENGTH_BIN``, or a multiple of it so at most ``bins`` bins
    cover the ``longest`` structure (PubTabNet's reach 500 tokens)."""
    return LENGTH_BIN * max(1, math.ceil((longest + 1) / (LENGTH_BIN * bins)))


def accuracy_by_length(records: Sequence[Sequence[Any]]) -> List[Dict[str, Any]]:
    """Per bin of labelled structure length: ``[{"lengths": "a-b", "tables", "correct", "acc",
    "teds"}]`` from records ``(index, length, correct, teds or None)`` (``teds`` None when not
    computed); only the bins holding tables, in increasing length."""
    if not records:
        return []
    width = length_bin_width(max(int(r[1]) for r in records))
    groups: Dict[int, List[Sequence[Any]]] = {}
    for record in records:
        groups.setdefault(int(record[1]) // width, []).append(record)
    rows = []
    for key in sorted(groups):
        group = groups[key]
        correct = sum(int(r[2]) for r in group)
        teds = [float(r[3]) for r in group if r[3] is not None]
        rows.append(
            {
                "lengths": f"{key * width}-{key * width + width - 1}",
                "tables": len(group),
                "correct": correct,
                "acc": correct / len(group),
                "teds": math.fsum(teds) / len(teds) if teds else None,
            }
        )
    return rows


def _box_list(boxes: Any) -> List[List[float]]:
    return [[float(v) for v in np.asarray(box).reshape(-1)] for box in boxes]


def _tokens(tokens: Sequence[str], limit: int = 200) -> str:
    """Tokens joined as inline code for a markdown cell (cut at ``limit`` characters)."""
    text = "".join(tokens).replace("|", "\\|").replace("`", "'")
    return "`" + (text if len(text) <= limit else text[: limit - 3] + "...") + "`" if text else "(empty)"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]
