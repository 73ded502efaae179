"""Table recognition metric (PaddleOCR's ``TableMetric``): structure accuracy, optionally the cell
boxes' precision / recall / hmean (``compute_bbox_metric``) and the structure TEDS (``teds``)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ppdist.errors import ConfigError
from ppdist.metrics.base import Metric
from ppdist.metrics.polygon_match import MatchCounts, Point, match_counts
from ppdist.metrics.teds import TEDS, structure_html
from ppdist.registry import METRICS

EPS = 1e-6
BOX_WIDTHS = {"xyxy": 4, "xywh": 4, "xyxyxyxy": 8}
BOX_FORMATS = tuple(BOX_WIDTHS)
SECTION_TAGS = ("<thead>", "</thead>", "<tbody>", "</tbody>")


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
    numbers. ``compute`` does not reset.
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
        self.reset()

    @staticmethod
    def check_values(options: Mapping[str, Any], where: str) -> None:
        """Config validation: the values ``__init__`` would refuse."""
        check_metric_options(options, where)

    def reset(self) -> None:
        self.correct_num = 0
        self.all_num = 0
        self.box_counts = MatchCounts(0, 0, 0)
        self.teds_scores: List[float] = []

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
        for (pred, _score), gt in zip(preds, gts):
            self.correct_num += int(self._structure_text(pred) == self._structure_text(gt))
            self.all_num += 1
            if self.teds is not None:
                self.teds_scores.append(self.teds.evaluate(structure_html(pred), structure_html(gt)))
        if self.compute_bbox_metric:
            for pred_boxes, gt_boxes in zip(results["bbox_batch_list"], labels["bbox_batch_list"]):
                counts = match_counts(
                    [box_polygon(b, self.box_format) for b in gt_boxes],
                    [box_polygon(b, self.box_format) for b in pred_boxes],
                )
                self.box_counts = MatchCounts(*(a + b for a, b in zip(self.box_counts, counts)))

    def state(self) -> Dict[str, Any]:
        return {
            "correct_num": self.correct_num,
            "all_num": self.all_num,
            "box_counts": list(self.box_counts),
            "teds_scores": list(self.teds_scores),
        }

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        self.reset()
        for part in states:
            self.correct_num += int(part["correct_num"])
            self.all_num += int(part["all_num"])
            self.box_counts = MatchCounts(*(a + int(b) for a, b in zip(self.box_counts, part["box_counts"])))
            self.teds_scores.extend(float(s) for s in part["teds_scores"])

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
