"""COCO bbox metrics with pycocotools from detections gathered over every rank.

The state is the list of detections (COCO results format) and the evaluated image ids;
merging concatenates them in rank order (contiguous eval shards), so every rank scores
exactly the detections a single process would.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch
import torch.distributed as dist
from pycocotools.cocoeval import COCOeval

from ppdist.metrics.base import Metric
from ppdist.registry import METRICS
from ppdist.utils.atomic import write_text_atomic

logger = logging.getLogger("ppdist")
STAT_NAMES = (
    "ap",
    "ap50",
    "ap75",
    "ap_small",
    "ap_medium",
    "ap_large",
    "ar1",
    "ar10",
    "ar100",
    "ar_small",
    "ar_medium",
    "ar_large",
)


def _is_main_process() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def coco_bbox_eval(
    coco_gt: Any, detections: List[Dict[str, Any]], image_ids: List[int], classwise: bool = False
) -> Dict[str, Any]:
    """The 12 COCO stats (and per-class AP) of ``detections`` on ``image_ids``."""
    if not detections:
        out: Dict[str, Any] = {name: 0.0 for name in STAT_NAMES}
        if classwise:
            out["class_ap"] = [0.0] * len(coco_gt.getCatIds())
        return out
    with contextlib.redirect_stdout(io.StringIO()) as text:
        coco_dt = coco_gt.loadRes(detections)
        evaluator = COCOeval(coco_gt, coco_dt, "bbox")
        evaluator.params.imgIds = sorted(image_ids)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    for line in text.getvalue().splitlines():
        if line.strip().startswith("Average"):
            logger.info("%s", line.rstrip())
    out = {name: float(v) for name, v in zip(STAT_NAMES, evaluator.stats)}
    if classwise:
        precision = evaluator.eval["precision"]  # [T, R, K, A, M]
        per_class = []
        for k in range(precision.shape[2]):
            values = precision[:, :, k, 0, -1]
            values = values[values > -1]
            per_class.append(float(np.mean(values)) if values.size else 0.0)
        out["class_ap"] = per_class
    return out


@METRICS.register
class COCOMetric(Metric):
    """COCO bbox AP/AR of ``MultiClassNMS`` results against the eval dataset's annotation file.

    ``bind_dataset`` (called by the evaluator) takes the ground truth and the contiguous-index
    -> COCO category id map from a ``COCODataSet``. ``output_dir`` writes ``bbox.json`` (rank 0).
    """

    def __init__(
        self,
        main_indicator: str = "ap",
        classwise: bool = False,
        output_dir: Optional[str] = None,
        bias: int = 0,
    ) -> None:
        if main_indicator not in STAT_NAMES:
            raise ValueError(f"COCOMetric.main_indicator must be one of {STAT_NAMES}, got {main_indicator!r}")
        self.main_indicator = main_indicator
        self.classwise = classwise
        self.output_dir = output_dir
        self.bias = bias
        self.coco_gt: Any = None
        self.clsid2catid: Dict[int, int] = {}
        self.label_list: List[str] = []
        self.reset()

    def bind_dataset(self, dataset: Any) -> None:
        for attr in ("coco", "clsid2catid"):
            if not hasattr(dataset, attr):
                raise ValueError(
                    f"COCOMetric needs a COCO-style eval dataset (with '{attr}'), got "
                    f"{type(dataset).__name__}"
                )
        self.coco_gt = dataset.coco
        self.clsid2catid = dict(dataset.clsid2catid)
        self.label_list = list(getattr(dataset, "label_list", []))

    def reset(self) -> None:
        self.detections: List[Dict[str, Any]] = []
        self.image_ids: List[int] = []

    def update(self, results: List[Mapping[str, Any]], batch: Mapping[str, Any]) -> None:
        """Add a batch's detections: its image ids and its detections cross to the host in one
        transfer each (not three per image)."""
        if not results:
            return
        ids = torch.stack([torch.as_tensor(r["im_id"]).reshape(()).to(torch.int64) for r in results])
        image_ids = ids.cpu().tolist()
        rows = [
            torch.cat(
                [
                    r["boxes"].detach().double(),
                    r["scores"].detach().double()[:, None],
                    r["labels"].detach().double()[:, None],
                ],
                dim=1,
            )
            for r in results
        ]
        table = torch.cat(rows).cpu().numpy()
        start = 0
        for image_id, row in zip(image_ids, rows):
            self.image_ids.append(image_id)
            for x1, y1, x2, y2, score, label in table[start : start + len(row)]:
                self.detections.append(
                    {
                        "image_id": image_id,
                        "category_id": self.clsid2catid[int(label)],
                        "bbox": [
                            float(x1),
                            float(y1),
                            float(x2 - x1 + self.bias),
                            float(y2 - y1 + self.bias),
                        ],
                        "score": float(score),
                    }
                )
            start += len(row)

    def state(self) -> Dict[str, Any]:
        return {"detections": self.detections, "image_ids": self.image_ids}

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        self.reset()
        for state in states:
            self.detections.extend(state["detections"])
            self.image_ids.extend(state["image_ids"])

    def compute(self) -> Dict[str, Any]:
        if self.coco_gt is None:
            raise RuntimeError("COCOMetric.compute before bind_dataset: the evaluator binds the eval dataset")
        if self.output_dir and _is_main_process():
            path = os.path.join(self.output_dir, "bbox.json")
            write_text_atomic(path, json.dumps(self.detections))
            logger.info("detections written to %s (COCO results format)", path)
        out = coco_bbox_eval(self.coco_gt, self.detections, self.image_ids, self.classwise)
        if self.classwise and self.label_list:
            for name, ap in zip(self.label_list, out["class_ap"]):
                logger.info("class %-20s AP %.4f", name, ap)
        out["images"] = len(self.image_ids)
        return out
