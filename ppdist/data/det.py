"""Object-detection dataset in COCO layout (PaddleDetection's ``COCODataSet``).

``read`` gives the encoded image bytes (the ``Decode`` transform decodes them) with the
image's ground truth. After the transforms a sample holds, in train mode, ``image``,
``im_id`` int64 [1], ``im_shape``, ``scale_factor``, ``gt_bbox`` float32 [N, 4] xyxy,
``gt_class`` int64 [N, 1] and ``is_crowd`` int32 [N, 1] (the batch transforms ``PadGT`` etc.
make them stackable); in eval mode ``image``, ``im_id``, ``im_shape``, ``scale_factor`` and
``ori_shape`` only: the COCO metric reads the ground truth from ``anno_file``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from ppdist.data.base import BaseDataSet, inside_root
from ppdist.data.coco_index import build_coco_index
from ppdist.data.index_cache import cached_index
from ppdist.data.packed import string_at
from ppdist.errors import ConfigError, DataError, DataPathError
from ppdist.registry import DATASETS

logger = logging.getLogger("ppdist")

TRAIN_KEYS = ("image", "im_id", "im_shape", "scale_factor", "gt_bbox", "gt_class", "is_crowd")
EVAL_KEYS = ("image", "im_id", "im_shape", "scale_factor", "ori_shape")


def _section(mode: str) -> str:
    return "Train.dataset" if mode == "train" else "Eval.dataset"


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

    The parsed json is kept as a compact index (``ppdist.data.coco_index``), not as Python
    objects; ``cache`` (``auto``, ``off`` or a folder) builds it once per node and maps it in
    every other process and run. The ground truth for evaluation is read by the metric.
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
        cache: Union[str, bool] = "auto",
    ) -> None:
        super().__init__(transforms, mode)
        sec = _section(mode)
        self.allow_paths_outside_root = bool(allow_paths_outside_root)
        if not isinstance(dataset_dir, str) or not os.path.isdir(dataset_dir):
            raise DataPathError(f"{sec}.dataset_dir: directory not found: {dataset_dir}")
        self.dataset_dir = dataset_dir
        self.image_dir = os.path.join(dataset_dir, image_dir or "")
        self.anno_file = os.path.abspath(os.path.join(dataset_dir, anno_path))
        if not os.path.isfile(self.anno_file):
            raise DataPathError(f"{sec}.anno_path: annotation file not found: {self.anno_file}")
        if not 0.0 <= float(empty_ratio) <= 1.0:
            raise ConfigError(
                f"{sec}.empty_ratio must lie in [0, 1] (1: keep every empty image), got {empty_ratio!r}"
            )
        self.seed = seed
        self.allow_empty = bool(allow_empty)
        self.empty_ratio = float(empty_ratio)
        self.load_crowd = bool(load_crowd)
        options = {
            "mode": mode,
            "allow_empty": self.allow_empty,
            "empty_ratio": self.empty_ratio,
            "load_crowd": self.load_crowd,
            "seed": int(seed),
        }
        try:
            self.index = cached_index(
                cache,
                f"{sec}.cache",
                "coco",
                [self.anno_file],
                options,
                lambda: build_coco_index(self.anno_file, **options),
                what=f"{sec} ({os.path.basename(self.anno_file)})",
            )
        except (DataError, MemoryError):
            raise
        except Exception as exc:
            raise DataError(
                f"{sec}.anno_path: cannot load {self.anno_file} as COCO json: {type(exc).__name__}: {exc}"
            ) from exc
        meta = self.index.meta
        cat_ids = list(meta["cat_ids"])
        if not cat_ids:
            raise DataError(f"{self.anno_file} defines no categories")
        self.catid2clsid: Dict[int, int] = {cat: i for i, cat in enumerate(cat_ids)}
        self.clsid2catid: Dict[int, int] = {i: cat for i, cat in enumerate(cat_ids)}
        self.label_list: List[str] = list(meta["label_list"])
        self.dropped_annotations: Dict[str, int] = dict(meta["dropped"])
        self.num_empty_images: int = int(meta["num_empty_images"])
        self._report(meta["drop_summary"])
        if len(self) == 0:
            raise DataError(
                f"{sec}: no usable image in {self.anno_file}"
                + ("" if mode == "eval" else " (training needs images with boxes, or allow_empty)")
            )

    def _report(self, summary: str) -> None:
        """The log lines of what was not loaded (also when the index comes from the cache)."""
        if summary:
            total = sum(self.dropped_annotations.values())
            only_crowd = all(r == "crowd" for r in self.dropped_annotations)
            log = logger.info if only_crowd else logger.warning
            log("%s: %d annotation(s) not loaded: %s", self.anno_file, total, summary)
        if self.mode == "train" and not self.allow_empty and self.num_empty_images:
            logger.info(
                "%s: %d image(s) without boxes are not used for training (allow_empty: false)",
                self.anno_file,
                self.num_empty_images,
            )

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.index["im_id"])

    def image_id(self, index: int) -> int:
        """The COCO image id of sample ``index``."""
        return int(self.index["im_id"][index])

    def image_path(self, index: int) -> str:
        """``image_dir`` joined with sample ``index``'s ``file_name``."""
        name = string_at(self.index["file_name_bytes"], self.index["file_name_offsets"], index)
        return os.path.join(self.image_dir, name)

    def origin(self, index: int) -> str:
        return (
            f"{os.path.basename(self.anno_file)} image id {self.image_id(index)} ({self.image_path(index)})"
        )

    def read(self, index: int) -> Dict[str, Any]:
        im_id, path = self.image_id(index), self.image_path(index)
        inside_root(self.dataset_dir, path, self.allow_paths_outside_root, "allow_paths_outside_root")
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as exc:
            raise DataError(f"image id {im_id}: cannot read {path} ({exc.strerror or exc})") from exc
        rows = slice(int(self.index["box_start"][index]), int(self.index["box_start"][index + 1]))
        return {
            "image": raw,
            "im_id": im_id,
            "h": float(self.index["height"][index]),
            "w": float(self.index["width"][index]),
            "gt_bbox": np.array(self.index["gt_bbox"][rows], dtype=np.float32),
            "gt_class": np.array(self.index["gt_class"][rows], dtype=np.int32).reshape(-1, 1),
            "is_crowd": np.array(self.index["is_crowd"][rows], dtype=np.int32).reshape(-1, 1),
        }

    def image_hw(self, data: Mapping[str, Any]) -> Optional[Tuple[int, int]]:
        """The image's (height, width) as resized (``im_shape``; the batch pads it, never shrinks it);
        None while the resize is pending."""
        if "im_shape" not in data or not isinstance(data.get("image"), np.ndarray):
            return None
        height, width = np.asarray(data["im_shape"], dtype=np.float64).reshape(2)
        return int(round(height)), int(round(width))

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
