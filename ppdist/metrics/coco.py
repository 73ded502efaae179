"""COCO bbox metrics from detections gathered over every rank, with faster_coco_eval (when
installed) or pycocotools.

The state is a float64 table of detections (one row per box) and the evaluated image ids;
merging concatenates them in rank order (contiguous eval shards), so the process that computes
scores exactly the detections a single process would.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from ppdist.metrics.base import Metric
from ppdist.metrics.det_confusion import detection_confusion
from ppdist.metrics.report import ConfusionMatrix, PRCurves, ReportItem, TextFile, markdown_table
from ppdist.registry import METRICS
from ppdist.utils import strict_json
from ppdist.utils.atomic import atomic_file

try:  # a dependency of ppdist, optional here: without it COCOMetric evaluates with pycocotools
    from faster_coco_eval import COCO as FasterCOCO
    from faster_coco_eval import COCOeval_faster
except ImportError:  # pragma: no cover - installed with ppdist
    FasterCOCO = COCOeval_faster = None

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


BACKENDS = ("pycocotools", "faster_coco_eval")


def resolve_backend(backend: str) -> str:
    """``auto``: faster_coco_eval when it is installed, else pycocotools; a named backend as it is
    (faster_coco_eval must then be installed)."""
    if backend == "auto":
        return "faster_coco_eval" if COCOeval_faster is not None else "pycocotools"
    if backend not in BACKENDS:
        raise ValueError(f"COCOMetric.backend must be auto or one of {BACKENDS}, got {backend!r}")
    if backend == "faster_coco_eval" and COCOeval_faster is None:
        raise ValueError(
            "COCOMetric.backend faster_coco_eval is not installed: pip install faster-coco-eval, "
            "or use backend: pycocotools"
        )
    return backend


def coco_classes(backend: str) -> Tuple[Any, Any]:
    """(COCO, COCOeval) of ``backend``: pycocotools (PaddleDetection's, the reference numbers) or
    faster_coco_eval (the same algorithm in C++; stats equal to pycocotools' within 1e-15)."""
    if backend == "faster_coco_eval":
        return FasterCOCO, COCOeval_faster
    return COCO, COCOeval


MAX_EVAL_CELLS = 8_000_000  # images x categories evaluated at once (~1 GB of per-cell results)


def evaluate_in_category_chunks(
    evaluator_cls: Any, coco_gt: Any, coco_dt: Any, image_ids: List[int], max_cells: int
) -> Any:
    """A summarized COCOeval over every category, run on groups of categories of at most
    ``max_cells`` images x categories each: the per-(image, category) results that COCOeval keeps
    grow with images x categories (~30 GB for Objects365's 80k x 365), and categories are
    accumulated independently, so the concatenated precision / recall / scores are exactly those of
    one run over all of them."""
    cat_ids = sorted(coco_gt.getCatIds())
    per_chunk = max(1, max_cells // max(1, len(image_ids)))
    parts: List[Dict[str, np.ndarray]] = []
    evaluator: Any = None
    for start in range(0, len(cat_ids), per_chunk):
        evaluator = None  # free the previous group's per-cell results first
        evaluator = evaluator_cls(coco_gt, coco_dt, "bbox")
        evaluator.params.imgIds = sorted(image_ids)
        evaluator.params.catIds = cat_ids[start : start + per_chunk]
        evaluator.evaluate()
        evaluator.accumulate()
        parts.append({key: evaluator.eval[key] for key in ("precision", "recall", "scores")})
    if len(parts) > 1:
        evaluator.params.catIds = cat_ids
        for key, axis in (("precision", 2), ("recall", 1), ("scores", 2)):
            evaluator.eval[key] = np.concatenate([part[key] for part in parts], axis=axis)
        evaluator.eval["counts"] = list(evaluator.eval["precision"].shape)
    evaluator.summarize()
    return evaluator


def coco_bbox_eval(
    coco_gt: Any,
    detections: np.ndarray,
    image_ids: List[int],
    classwise: bool = False,
    backend: str = "pycocotools",
    max_cells: int = MAX_EVAL_CELLS,
    keep: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The 12 COCO stats (and per-class AP) of ``detections`` (float64 rows ``[image_id, x, y, w, h,
    score, category_id]``) on ``image_ids``; the dicts pycocotools needs exist only during the call,
    and at most ``max_cells`` images x categories are evaluated at once."""
    if not len(detections):
        out: Dict[str, Any] = {name: 0.0 for name in STAT_NAMES}
        if classwise:
            out["class_ap"] = [0.0] * len(coco_gt.getCatIds())
        return out
    with contextlib.redirect_stdout(io.StringIO()) as text:
        coco_dt = coco_gt.loadRes(
            [
                {"image_id": int(r[0]), "category_id": int(r[6]), "bbox": r[1:5], "score": r[5]}
                for r in detections.tolist()
            ]
        )
        evaluator = evaluate_in_category_chunks(
            coco_classes(backend)[1], coco_gt, coco_dt, image_ids, max_cells
        )
    for line in text.getvalue().splitlines():
        if line.strip().startswith("Average"):
            logger.info("%s", line.rstrip())
    out = {name: float(v) for name, v in zip(STAT_NAMES, evaluator.stats)}
    if keep is not None:  # COCOeval's own arrays, for the pictures (ppdist.visualize.eval_pictures)
        keep.update(
            precision=np.asarray(evaluator.eval["precision"]),
            recall_thresholds=np.asarray(evaluator.params.recThrs),
        )
    if classwise:
        out["class_ap"] = class_average_precision(evaluator.eval["precision"])  # [T, R, K, A, M]
    return out


def ground_truth_boxes(coco_gt: Any, image_ids: List[int]) -> int:
    """The non-crowd ground-truth boxes of ``image_ids`` (what COCOeval scores)."""
    if not image_ids:
        return 0  # (getAnnIds of no image id means every annotation)
    annotations = coco_gt.loadAnns(coco_gt.getAnnIds(imgIds=image_ids))
    return sum(1 for annotation in annotations if not annotation.get("iscrowd", 0))


def load_ground_truth(anno_file: str, backend: str = "pycocotools") -> Any:
    """The ``COCO`` object of ``backend`` for ``anno_file`` (its progress prints silenced)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return coco_classes(backend)[0](anno_file)


def write_detections_json(path: str, table: np.ndarray) -> None:
    """``table`` rows ``[image_id, x, y, w, h, score, category_id]`` as a COCO results json,
    written in chunks (atomically) so a large set never exists as one list of dicts."""
    with atomic_file(path) as handle:
        handle.write("[")
        for start in range(0, len(table), 100_000):
            rows = table[start : start + 100_000]
            handle.write(", " if start else "")
            handle.write(
                ", ".join(
                    strict_json.dumps(
                        {"image_id": int(r[0]), "category_id": int(r[6]), "bbox": r[1:5], "score": r[5]}
                    )
                    for r in rows.tolist()
                )
            )
        handle.write("]")


@METRICS.register
class COCOMetric(Metric):
    """COCO bbox AP/AR of ``MultiClassNMS`` results against the eval dataset's annotation file.

    ``bind_dataset`` (called by the evaluator) takes the annotation file and the contiguous-index
    -> COCO category id map from a ``COCODataSet``; the ground truth is read only by the process
    that computes (rank 0), once. Detections are kept as one float64 row per box
    (``[image_id, x, y, w, h, score, category_id]``, 56 bytes), not as Python dicts.
    ``output_dir`` writes ``bbox.json`` (rank 0). ``backend``: ``auto`` (default: faster_coco_eval
    when installed, else pycocotools), ``faster_coco_eval`` (the same evaluation in C++, 5-7x faster
    measured; stats equal to pycocotools' within 1e-15) or ``pycocotools`` (PaddleDetection's).
    """

    def __init__(
        self,
        main_indicator: str = "ap",
        classwise: bool = False,
        output_dir: Optional[str] = None,
        bias: int = 0,
        backend: str = "auto",
        confusion_iou: float = 0.5,
        confusion_score: float = 0.25,
    ) -> None:
        if main_indicator not in STAT_NAMES:
            raise ValueError(f"COCOMetric.main_indicator must be one of {STAT_NAMES}, got {main_indicator!r}")
        self.backend = resolve_backend(backend)
        self.main_indicator = main_indicator
        self.classwise = classwise
        self.output_dir = output_dir
        self.bias = bias
        self.confusion_iou, self.confusion_score = float(confusion_iou), float(confusion_score)
        for key, value in (("confusion_iou", self.confusion_iou), ("confusion_score", self.confusion_score)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"COCOMetric.{key} must be between 0 and 1, got {value}")
        self.anno_file: Optional[str] = None
        self._ground_truth: Any = None
        self.clsid2catid: Dict[int, int] = {}
        self.label_list: List[str] = []
        self.last_compute_s = 0.0
        self.reset()

    def bind_dataset(self, dataset: Any) -> None:
        for attr in ("anno_file", "clsid2catid"):
            if not hasattr(dataset, attr):
                raise ValueError(
                    f"COCOMetric needs a COCO-style eval dataset (with '{attr}'), got "
                    f"{type(dataset).__name__}"
                )
        if dataset.anno_file != self.anno_file:
            self._ground_truth = None
        self.anno_file = dataset.anno_file
        self.clsid2catid = dict(dataset.clsid2catid)
        self.label_list = list(getattr(dataset, "label_list", []))
        self._category_of = np.array(
            [self.clsid2catid.get(i, -1) for i in range(max(self.clsid2catid, default=-1) + 1)],
            dtype=np.float64,
        )

    @property
    def coco_gt(self) -> Any:
        """The ground truth (read on first use)."""
        if self._ground_truth is None:
            if self.anno_file is None:
                raise RuntimeError(
                    "COCOMetric.compute before bind_dataset: the evaluator binds the eval dataset"
                )
            self._ground_truth = load_ground_truth(self.anno_file, self.backend)
        return self._ground_truth

    def reset(self) -> None:
        self._tables: List[np.ndarray] = []
        self._image_ids: List[np.ndarray] = []

    def update(self, results: List[Mapping[str, Any]], batch: Mapping[str, Any]) -> None:
        """Add a batch's detections: its image ids and its detections cross to the host in one
        transfer each (not three per image)."""
        if not results:
            return
        ids = torch.stack([torch.as_tensor(r["im_id"]).reshape(()).to(torch.int64) for r in results])
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
        image_ids = ids.cpu().numpy()
        boxes = torch.cat(rows).cpu().numpy()  # x1, y1, x2, y2, score, class
        table = np.empty((len(boxes), 7), dtype=np.float64)
        table[:, 0] = np.repeat(image_ids, [len(row) for row in rows])
        table[:, 1:3] = boxes[:, 0:2]
        table[:, 3:5] = boxes[:, 2:4] - boxes[:, 0:2] + self.bias
        table[:, 5] = boxes[:, 4]
        table[:, 6] = self._category_of[boxes[:, 5].astype(np.int64)]
        self._tables.append(table)
        self._image_ids.append(image_ids)

    @property
    def detections(self) -> np.ndarray:
        """All detections so far, ``[image_id, x, y, w, h, score, category_id]`` float64 rows."""
        return np.concatenate(self._tables) if self._tables else np.zeros((0, 7), dtype=np.float64)

    @property
    def image_ids(self) -> List[int]:
        return np.concatenate(self._image_ids).tolist() if self._image_ids else []

    def state(self) -> Dict[str, Any]:
        return {"detections": self.detections, "image_ids": np.asarray(self.image_ids, dtype=np.int64)}

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        self.reset()
        for state in states:
            self._tables.append(np.asarray(state["detections"], dtype=np.float64).reshape(-1, 7))
            self._image_ids.append(np.asarray(state["image_ids"], dtype=np.int64))

    def compute(self) -> Dict[str, Any]:
        if self.anno_file is None:
            raise RuntimeError("COCOMetric.compute before bind_dataset: the evaluator binds the eval dataset")
        start = time.perf_counter()
        table = self.detections
        if self.output_dir and _is_main_process():
            path = os.path.join(self.output_dir, "bbox.json")
            write_detections_json(path, table)
            logger.info("detections written to %s (COCO results format)", path)
        image_ids = self.image_ids
        self.last_eval = {}
        self.nothing_evaluated = None
        if ground_truth_boxes(self.coco_gt, image_ids) == 0:  # no score, not 0 (nor COCO's -1)
            self.nothing_evaluated = (
                f"the {len(image_ids)} evaluated image(s) of {self.anno_file} hold no ground-truth box "
                f"(crowd boxes are not scored)"
            )
            out: Dict[str, Any] = {name: float("nan") for name in STAT_NAMES}
            if self.classwise:
                out["class_ap"] = [float("nan")] * len(self.coco_gt.getCatIds())
        else:
            out = coco_bbox_eval(
                self.coco_gt, table, image_ids, self.classwise, self.backend, keep=self.last_eval
            )
        if self.classwise and self.label_list:
            for name, ap in zip(self.label_list, out["class_ap"]):
                logger.info("class %-20s AP %.4f", name, ap)
        out["images"] = len(image_ids)
        self.last_compute_s = time.perf_counter() - start
        logger.info(
            "COCO evaluation of %d detection(s) on %d image(s) took %.1f s",
            len(table),
            len(image_ids),
            self.last_compute_s,
        )
        return out

    def report(
        self, iou_threshold: Optional[float] = None, score_threshold: Optional[float] = None
    ) -> List[ReportItem]:
        """``pr_curves.png`` (COCOeval's precision array) and ``class_ap.md`` of the last ``compute``,
        ``confusion_matrix.png`` (at ``iou_threshold`` / ``score_threshold``; default
        ``confusion_iou`` / ``confusion_score``)."""
        iou_threshold = self.confusion_iou if iou_threshold is None else iou_threshold
        score_threshold = self.confusion_score if score_threshold is None else score_threshold
        names = self.label_list or [str(c) for c in sorted(self.clsid2catid.values())]
        items: List[ReportItem] = []
        precision = getattr(self, "last_eval", {}).get("precision")
        if precision is not None:
            rows = [(name, f"{ap:.4f}") for name, ap in zip(names, class_average_precision(precision))]
            items += [
                PRCurves("pr_curves.png", precision, self.last_eval["recall_thresholds"], names),
                TextFile("class_ap.md", markdown_table(["class", "AP (IoU 0.5:0.95)"], rows, "Per-class AP")),
            ]
        title = f"boxes at IoU >= {iou_threshold:g}, score >= {score_threshold:g} (counts)"
        matrix = self.confusion(iou_threshold, score_threshold)
        return items + [ConfusionMatrix("confusion_matrix.png", matrix, list(names) + ["background"], title)]

    def confusion(self, iou_threshold: float = 0.5, score_threshold: float = 0.25) -> np.ndarray:
        """The detection confusion matrix of the evaluated images (``detection_confusion``; crowd
        ground truth left out, as COCOeval ignores it)."""
        clsid_of = {cat: cls for cls, cat in self.clsid2catid.items()}
        image_ids = set(self.image_ids)
        ground_truth = {}
        for image in image_ids:
            anns = [
                a
                for a in self.coco_gt.loadAnns(self.coco_gt.getAnnIds(imgIds=[image]))
                if not a.get("iscrowd")
            ]
            boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)]).reshape(
                -1, 4
            )
            ground_truth[image] = (boxes, np.array([clsid_of[a["category_id"]] for a in anns], dtype=int))
        table = self.detections
        image_of = table[:, 0].astype(np.int64)
        order = np.argsort(image_of, kind="stable")  # each image's rows together, in their order
        table, image_of = table[order], image_of[order]
        class_of = np.array([clsid_of.get(int(c), -1) for c in table[:, 6]], dtype=np.int64)
        bounds = np.flatnonzero(np.diff(image_of)) + 1
        detections = {}
        for rows, classes in zip(np.split(table, bounds), np.split(class_of, bounds)):
            if len(rows) and int(rows[0, 0]) in image_ids:
                boxes = np.concatenate([rows[:, 1:3], rows[:, 1:3] + rows[:, 3:5] - self.bias], axis=1)
                detections[int(rows[0, 0])] = (boxes, classes, rows[:, 5])
        return detection_confusion(
            ground_truth, detections, len(self.clsid2catid), iou_threshold, score_threshold
        )


def class_average_precision(precision: np.ndarray) -> List[float]:
    """Per-class AP (IoU 0.5:0.95, area all, maxDets 100) from COCOeval's precision array, as
    its summary and ``classwise`` compute it (the mean of the defined values)."""
    out = []
    for k in range(precision.shape[2]):
        values = precision[:, :, k, 0, -1]
        values = values[values > -1]
        out.append(float(np.mean(values)) if values.size else 0.0)
    return out
