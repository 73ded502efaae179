"""Object-detection dataset in COCO layout (PaddleDetection's ``COCODataSet``).

``read`` gives the encoded image bytes (the ``Decode`` transform decodes them) with the
image's ground truth. After the transforms a sample holds, in train mode, ``image``,
``im_id`` int64 [1], ``im_shape``, ``scale_factor``, ``gt_bbox`` float32 [N, 4] xyxy,
``gt_class`` int64 [N, 1] and ``is_crowd`` int32 [N, 1] (the batch transforms ``PadGT`` etc.
make them stackable); in eval mode ``image``, ``im_id``, ``im_shape``, ``scale_factor`` and
``ori_shape`` only: the COCO metric reads the ground truth from ``anno_file``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
from typing import Any, Dict, List, NamedTuple, Tuple

import numpy as np
from pycocotools.coco import COCO

from ppdist.data.base import BaseDataSet, inside_root
from ppdist.errors import ConfigError, DataError
from ppdist.registry import DATASETS

logger = logging.getLogger("ppdist")

TRAIN_KEYS = ("image", "im_id", "im_shape", "scale_factor", "gt_bbox", "gt_class", "is_crowd")
EVAL_KEYS = ("image", "im_id", "im_shape", "scale_factor", "ori_shape")
# reasons an annotation is not loaded, in the order they are reported
DROP_REASONS = (
    "crowd",
    "ignore flag",
    "no bbox",
    "area <= 0",
    "width/height <= 1e-5",
    "outside the image",
    "unknown category",
)
MAX_EXAMPLES = 5


class _Record(NamedTuple):
    im_id: int
    path: str
    h: float
    w: float
    gt_bbox: np.ndarray  # float32 [N, 4] xyxy
    gt_class: np.ndarray  # int32 [N, 1]
    is_crowd: np.ndarray  # int32 [N, 1]


def _section(mode: str) -> str:
    return "Train.dataset" if mode == "train" else "Eval.dataset"


def load_coco(path: str) -> Any:
    """A pycocotools ``COCO`` of ``path`` (its progress prints silenced)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(path)


@DATASETS.register
class COCODataSet(BaseDataSet):
    """COCO json + image folder; ``image_dir`` and ``anno_path`` are relative to ``dataset_dir``.

    Images are sorted by id; category ids are sorted and mapped to 0..K-1 (``catid2clsid``,
    ``clsid2catid``, ``label_list`` = names). Boxes become xyxy, clipped to the image. Not
    loaded: crowd annotations (unless ``load_crowd``), ``ignore`` ones, those without a box or
    with area <= 0, width/height <= 1e-5, nothing left after clipping, or an unknown category
    (never remapped); one warning line counts them by reason. Train mode drops images without
    boxes unless ``allow_empty`` (then ``empty_ratio`` in [0, 1) keeps empties at that fraction
    of the set, drawn with ``seed``); eval mode keeps every image. An image listed but missing
    on disk becomes a reported bad sample when read.
    """

    def __init__(
        self,
        dataset_dir: str,
        image_dir: str,
        anno_path: str,
        transforms: list,
        mode: str = "train",
        seed: int = 1024,
        allow_empty: bool = False,
        empty_ratio: float = 1.0,
        load_crowd: bool = False,
        allow_paths_outside_root: bool = False,
    ) -> None:
        super().__init__(transforms, mode)
        sec = _section(mode)
        self.allow_paths_outside_root = bool(allow_paths_outside_root)
        if not isinstance(dataset_dir, str) or not os.path.isdir(dataset_dir):
            raise DataError(f"{sec}.dataset_dir: directory not found: {dataset_dir}")
        self.dataset_dir = dataset_dir
        self.image_dir = os.path.join(dataset_dir, image_dir or "")
        self.anno_file = os.path.abspath(os.path.join(dataset_dir, anno_path))
        if not os.path.isfile(self.anno_file):
            raise DataError(f"{sec}.anno_path: annotation file not found: {self.anno_file}")
        if not 0.0 <= float(empty_ratio) <= 1.0:
            raise ConfigError(
                f"{sec}.empty_ratio must lie in [0, 1] (1: keep every empty image), got {empty_ratio!r}"
            )
        self.seed = seed
        self.allow_empty = bool(allow_empty)
        self.empty_ratio = float(empty_ratio)
        self.load_crowd = bool(load_crowd)
        try:
            self.coco = load_coco(self.anno_file)
        except Exception as exc:
            raise DataError(
                f"{sec}.anno_path: cannot load {self.anno_file} as COCO json: {type(exc).__name__}: {exc}"
            ) from exc
        cat_ids = sorted(self.coco.getCatIds())
        if not cat_ids:
            raise DataError(f"{self.anno_file} defines no categories")
        self.catid2clsid: Dict[int, int] = {cat: i for i, cat in enumerate(cat_ids)}
        self.clsid2catid: Dict[int, int] = {i: cat for i, cat in enumerate(cat_ids)}
        self.label_list: List[str] = [str(self.coco.cats[cat].get("name", cat)) for cat in cat_ids]
        self.records = self._parse()
        if not self.records:
            raise DataError(
                f"{sec}: no usable image in {self.anno_file}"
                + ("" if mode == "eval" else " (training needs images with boxes, or allow_empty)")
            )

    # ------------------------------------------------------------------ parsing
    def _parse(self) -> List[_Record]:
        drops: Dict[str, List[Tuple[int, Any]]] = {r: [] for r in DROP_REASONS}
        with_boxes: List[_Record] = []
        empty: List[_Record] = []
        has_annotations = "annotations" in self.coco.dataset
        for im_id in sorted(self.coco.getImgIds()):
            info = self.coco.imgs[im_id]
            w, h = float(info.get("width", 0) or 0), float(info.get("height", 0) or 0)
            anns = self.coco.imgToAnns.get(im_id, []) if has_annotations else []
            boxes, classes, crowd = [], [], []
            for ann in anns:
                reason = self._check(ann, w, h)
                if reason:
                    drops[reason].append((im_id, ann.get("id")))
                    continue
                x1, y1, bw, bh = (float(v) for v in ann["bbox"])
                box = [x1, y1, x1 + bw, y1 + bh]
                if w > 0 and h > 0:
                    box = [
                        min(max(box[0], 0.0), w),
                        min(max(box[1], 0.0), h),
                        min(max(box[2], 0.0), w),
                        min(max(box[3], 0.0), h),
                    ]
                boxes.append([round(v, 3) for v in box])
                classes.append(self.catid2clsid[ann["category_id"]])
                crowd.append(int(bool(ann.get("iscrowd", 0))))
            path = os.path.join(self.image_dir, info.get("file_name", ""))
            rec = _Record(
                int(im_id),
                path,
                h,
                w,
                np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
                np.asarray(classes, dtype=np.int32).reshape(-1, 1),
                np.asarray(crowd, dtype=np.int32).reshape(-1, 1),
            )
            (with_boxes if boxes else empty).append(rec)
        self._report(drops)
        self.num_empty_images = len(empty)
        if self.mode == "eval":
            return sorted(with_boxes + empty, key=lambda r: r.im_id)
        if not self.allow_empty:
            if empty:
                logger.info(
                    "%s: %d image(s) without boxes are not used for training (allow_empty: false)",
                    self.anno_file,
                    len(empty),
                )
            return with_boxes
        if self.empty_ratio < 1.0 and empty:
            keep = min(len(empty), int(len(with_boxes) * self.empty_ratio / (1.0 - self.empty_ratio)))
            rng = np.random.default_rng(self.seed & 0xFFFFFFFF)
            chosen = np.sort(rng.choice(len(empty), size=keep, replace=False))
            empty = [empty[i] for i in chosen]
        return sorted(with_boxes + empty, key=lambda r: r.im_id)

    def _check(self, ann: Dict[str, Any], w: float, h: float) -> str:
        """Why ``ann`` is not loaded ('' when it is)."""
        if ann.get("iscrowd", 0) and not self.load_crowd:
            return "crowd"
        if ann.get("ignore", False):
            return "ignore flag"
        bbox = ann.get("bbox")
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not any(bbox):
            return "no bbox"
        if ann.get("category_id") not in self.catid2clsid:
            return "unknown category"
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox
        ):
            raise DataError(
                f"{self.anno_file}: annotation id {ann.get('id')} (image id {ann.get('image_id')}) has bbox "
                f"{bbox!r}: expected four finite numbers [x, y, width, height]"
            )
        x1, y1, bw, bh = (float(v) for v in bbox)
        if float(ann.get("area", bw * bh)) <= 0:
            return "area <= 0"
        if bw <= 1e-5 or bh <= 1e-5:
            return "width/height <= 1e-5"
        if (
            w > 0
            and h > 0
            and (min(x1 + bw, w) - max(x1, 0.0) <= 1e-5 or min(y1 + bh, h) - max(y1, 0.0) <= 1e-5)
        ):
            return "outside the image"
        return ""

    def _report(self, drops: Dict[str, List[Tuple[int, Any]]]) -> None:
        parts = []
        for reason in DROP_REASONS:
            items = drops[reason]
            if not items:
                continue
            examples = ", ".join(f"image {im} (ann {ann})" for im, ann in items[:MAX_EXAMPLES])
            more = ", ..." if len(items) > MAX_EXAMPLES else ""
            parts.append(f"{reason}: {len(items)} [{examples}{more}]")
        self.dropped_annotations = {r: len(v) for r, v in drops.items() if v}
        if not parts:
            return
        total = sum(len(v) for v in drops.values())
        only_crowd = all(r == "crowd" for r in self.dropped_annotations)
        log = logger.info if only_crowd else logger.warning
        log("%s: %d annotation(s) not loaded: %s", self.anno_file, total, "; ".join(parts))

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.records)

    def origin(self, index: int) -> str:
        rec = self.records[index]
        return f"{os.path.basename(self.anno_file)} image id {rec.im_id} ({rec.path})"

    def read(self, index: int) -> Dict[str, Any]:
        rec = self.records[index]
        inside_root(self.dataset_dir, rec.path, self.allow_paths_outside_root, "allow_paths_outside_root")
        try:
            with open(rec.path, "rb") as handle:
                raw = handle.read()
        except OSError as exc:
            raise DataError(f"image id {rec.im_id}: cannot read {rec.path} ({exc.strerror or exc})") from exc
        return {
            "image": raw,
            "im_id": rec.im_id,
            "h": rec.h,
            "w": rec.w,
            "gt_bbox": rec.gt_bbox.copy(),
            "gt_class": rec.gt_class.copy(),
            "is_crowd": rec.is_crowd.copy(),
        }

    def finish(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """The stackable output keys (see the module doc) with their dtypes."""
        keys = TRAIN_KEYS if self.mode == "train" else EVAL_KEYS
        out = {k: data[k] for k in keys if k in data}
        out["im_id"] = np.array([int(np.asarray(data["im_id"]).reshape(-1)[0])], dtype=np.int64)
        for key in ("im_shape", "scale_factor", "ori_shape"):
            if key in out:
                out[key] = np.asarray(out[key], dtype=np.float32).reshape(2)
        if "gt_bbox" in out:
            out["gt_bbox"] = np.asarray(out["gt_bbox"], dtype=np.float32).reshape(-1, 4)
        if "gt_class" in out:
            out["gt_class"] = np.asarray(out["gt_class"], dtype=np.int64).reshape(-1, 1)
        if "is_crowd" in out:
            out["is_crowd"] = np.asarray(out["is_crowd"], dtype=np.int32).reshape(-1, 1)
        return out
