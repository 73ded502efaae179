"""A COCO instances json as a ``PackedIndex``: one row per image, boxes in flat arrays.

Reads the json as pycocotools does (images by id, the last of a repeated id wins; annotations
grouped by ``image_id`` in file order; categories sorted by id -> class 0..K-1) and keeps, per
image, its id, size, file name and ground-truth boxes, without keeping the json's Python objects.
Which annotations are loaded, and which images a training set keeps, is ``COCODataSet``'s
documented policy.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any, Dict, List, Tuple

import numpy as np

from ppdist.data.packed import PackedIndex, pack_strings
from ppdist.errors import DataError

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


def read_coco_json(path: str) -> Dict[str, Any]:
    """The json object in ``path``; ``DataError`` when it is not a COCO-style mapping."""
    with open(path, "rb") as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a COCO json object with 'images', got a {type(data).__name__}")
    return data


def _bad_bbox(ann: Dict[str, Any], where: str) -> DataError:
    return DataError(
        f"{where}: annotation id {ann.get('id')} (image id {ann.get('image_id')}) has bbox "
        f"{ann.get('bbox')!r}: expected four finite numbers [x, y, width, height]"
    )


_NUMBER = frozenset((int, float))  # exact types: json gives no subclasses, and bool is refused


def _early_reason(ann: Dict[str, Any], cat_ids: Dict[Any, int], load_crowd: bool) -> str:
    """The reasons decided from the annotation's fields alone ('' when its box must be checked)."""
    if ann.get("iscrowd", 0) and not load_crowd:
        return "crowd"
    if ann.get("ignore", False):
        return "ignore flag"
    bbox = ann.get("bbox")
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not any(bbox):
        return "no bbox"
    if ann.get("category_id") not in cat_ids:
        return "unknown category"
    return ""


def _box_reasons(box: np.ndarray, area: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Per box (xywh float64, with its area and its image's w, h): 0 loaded, else 1 + the index of
    'area <= 0', 'width/height <= 1e-5', 'outside the image' (the first that applies)."""
    x1, y1, bw, bh = box.T
    w, h = size.T
    known = (w > 0) & (h > 0)
    outside = known & (
        (np.minimum(x1 + bw, w) - np.maximum(x1, 0.0) <= 1e-5)
        | (np.minimum(y1 + bh, h) - np.maximum(y1, 0.0) <= 1e-5)
    )
    code = np.where(outside, 3, 0)
    code = np.where((bw <= 1e-5) | (bh <= 1e-5), 2, code)
    return np.where(area <= 0, 1, code)


def _clipped_boxes(box: np.ndarray, size: np.ndarray) -> np.ndarray:
    """xywh -> xyxy, clipped to the image when its size is known, rounded to 3 decimals (Python's
    ``round``, correctly rounded, as the reference loader did)."""
    xyxy = np.concatenate([box[:, :2], box[:, :2] + box[:, 2:]], axis=1)
    known = ((size[:, 0] > 0) & (size[:, 1] > 0))[:, None]
    limit = np.concatenate([size, size], axis=1)
    xyxy = np.where(known, np.minimum(np.maximum(xyxy, 0.0), limit), xyxy).ravel()
    # a value numpy's round leaves unchanged is the float nearest a 3-decimal number: Python's
    # round keeps it too; only the others need the exact (slow) rounding
    for i in np.flatnonzero(np.round(xyxy, 3) != xyxy).tolist():
        xyxy[i] = round(float(xyxy[i]), 3)
    return xyxy.reshape(-1, 4)


def drop_summary(drops: Dict[str, List[Tuple[int, Any]]]) -> str:
    """``reason: count [examples]; ...`` of the annotations not loaded ('' for none)."""
    parts = []
    for reason in DROP_REASONS:
        items = drops[reason]
        if items:
            examples = ", ".join(f"image {im} (ann {ann})" for im, ann in items[:MAX_EXAMPLES])
            more = ", ..." if len(items) > MAX_EXAMPLES else ""
            parts.append(f"{reason}: {len(items)} [{examples}{more}]")
    return "; ".join(parts)


def _kept_images(
    with_boxes: List[int], empty: List[int], mode: str, allow_empty: bool, empty_ratio: float, seed: int
) -> List[int]:
    """Which parsed images (by position) the dataset holds, in image-id order."""
    if mode == "eval":
        return sorted(with_boxes + empty)
    if not allow_empty:
        return with_boxes
    if empty_ratio < 1.0 and empty:
        keep = min(len(empty), int(len(with_boxes) * empty_ratio / (1.0 - empty_ratio)))
        rng = np.random.default_rng(seed & 0xFFFFFFFF)
        chosen = np.sort(rng.choice(len(empty), size=keep, replace=False))
        empty = [empty[i] for i in chosen]
    return sorted(with_boxes + empty)


def build_coco_index(
    anno_file: str, mode: str, allow_empty: bool, empty_ratio: float, load_crowd: bool, seed: int
) -> PackedIndex:
    """The images of ``anno_file`` the dataset keeps, with their loaded boxes.

    Arrays: ``im_id`` int64, ``height``/``width`` float64, ``file_name`` (``pack_strings``:
    ``file_name_bytes``/``file_name_offsets``), ``box_start`` int64 [n + 1] (image i's boxes are
    rows ``box_start[i]:box_start[i+1]``), ``gt_bbox`` float32 [m, 4] xyxy, ``gt_class`` int32 [m],
    ``is_crowd`` int32 [m]. ``meta``: ``cat_ids``, ``label_list``, ``dropped`` (count per reason),
    ``drop_summary``, ``num_empty_images``.
    """
    data = read_coco_json(anno_file)
    images: Dict[Any, Dict[str, Any]] = {img["id"]: img for img in data.get("images", [])}
    categories: Dict[Any, Dict[str, Any]] = {cat["id"]: cat for cat in data.get("categories", [])}
    cat_ids = sorted(cat["id"] for cat in data.get("categories", []))
    catid2clsid = {cat: i for i, cat in enumerate(cat_ids)}
    by_image: Dict[Any, List[Dict[str, Any]]] = defaultdict(list)
    for ann in data.get("annotations", []):
        by_image[ann["image_id"]].append(ann)
    del data
    drops: Dict[str, List[Tuple[int, Any]]] = {r: [] for r in DROP_REASONS}
    image_order = sorted(images)
    sizes = np.zeros((len(image_order), 2), dtype=np.float64)  # w, h
    checked: List[Dict[str, Any]] = []  # annotations whose box decides, in image-id then file order
    checked_image: List[int] = []
    values: List[Any] = []
    areas: List[Any] = []
    for row, im_id in enumerate(image_order):
        info = images[im_id]
        sizes[row] = float(info.get("width", 0) or 0), float(info.get("height", 0) or 0)
        for ann in by_image.get(im_id, ()):
            reason = _early_reason(ann, catid2clsid, load_crowd)
            if reason:
                drops[reason].append((im_id, ann.get("id")))
                continue
            bbox = ann["bbox"]
            checked.append(ann)
            checked_image.append(row)
            x, y, bw, bh = bbox
            numbers = (
                type(x) in _NUMBER and type(y) in _NUMBER and type(bw) in _NUMBER and type(bh) in _NUMBER
            )
            values.extend(bbox if numbers else (math.nan,) * 4)
            areas.append(ann.get("area", None))
    box = np.array(values, dtype=np.float64).reshape(-1, 4)
    for i in np.flatnonzero(~np.isfinite(box).all(axis=1))[:1]:
        raise _bad_bbox(checked[i], anno_file)
    on_image = np.array(checked_image, dtype=np.int64)
    area = np.array([float(a) if a is not None else np.nan for a in areas], dtype=np.float64)
    area = np.where(np.isnan(area), box[:, 2] * box[:, 3], area)
    codes = _box_reasons(box, area, sizes[on_image])
    for i in np.flatnonzero(codes):
        ann = checked[i]
        drops[DROP_REASONS[2 + int(codes[i])]].append((image_order[on_image[i]], ann.get("id")))
    loaded = np.flatnonzero(codes == 0)
    gt_bbox = _clipped_boxes(box[loaded], sizes[on_image[loaded]])
    gt_class = np.array([catid2clsid[checked[i]["category_id"]] for i in loaded.tolist()], dtype=np.int32)
    is_crowd = np.array([int(bool(checked[i].get("iscrowd", 0))) for i in loaded.tolist()], dtype=np.int32)
    del checked, values, areas, by_image
    counts = np.bincount(on_image[loaded], minlength=len(image_order))
    with_boxes = np.flatnonzero(counts > 0).tolist()
    empty = np.flatnonzero(counts == 0).tolist()
    kept = np.array(_kept_images(with_boxes, empty, mode, allow_empty, empty_ratio, seed), dtype=np.int64)
    box_start = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(counts[kept], out=box_start[1:])
    rows = np.flatnonzero(np.isin(on_image[loaded], kept))  # boxes are in image order, as ``kept``
    names = pack_strings(
        [str(images[image_order[i]].get("file_name", "")).encode("utf-8") for i in kept.tolist()]
    )
    return PackedIndex(
        {
            "im_id": np.array([int(image_order[i]) for i in kept.tolist()], dtype=np.int64),
            "height": sizes[kept, 1].copy(),
            "width": sizes[kept, 0].copy(),
            "file_name_bytes": names["bytes"],
            "file_name_offsets": names["offsets"],
            "box_start": box_start,
            "gt_bbox": gt_bbox[rows].astype(np.float32),
            "gt_class": gt_class[rows],
            "is_crowd": is_crowd[rows],
        },
        {
            "cat_ids": cat_ids,
            "label_list": [str(categories[cat].get("name", cat)) for cat in cat_ids],
            "dropped": {r: len(v) for r, v in drops.items() if v},
            "drop_summary": drop_summary(drops),
            "num_empty_images": len(empty),
        },
    )
