"""Synthetic object-detection data in COCO layout.

``generate_det_dataset`` draws shapes over muted, textured backgrounds::

    out_dir/images/train/00000000.jpg   out_dir/annotations/instances_train.json   out_dir/train.txt
    out_dir/images/val/00000000.jpg     out_dir/annotations/instances_val.json     out_dir/val.txt

Each class is one shape kind in its own saturated hue band; its COCO category id is
``2 * k + 1`` (1, 3, 5, ...), so loaders must map ids to contiguous classes. Objects span
about 8%-60% of the image side; later objects may cover earlier ones, but every object keeps
at least 40% of its pixels visible, and its box is tight around its visible pixels. A share of
the images (``empty_ratio``) holds no object. ``train.txt`` / ``val.txt`` list the image paths.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence, Tuple, Union

import cv2
import numpy as np

from ppdist.data.synthetic_io import build_atomically, check_setting, is_int
from ppdist.data.synthetic_seg import SHAPES, _background, _shape_fill, image_shape
from ppdist.registry import SYNTHETIC_DATA
from ppdist.utils import strict_json

CLASS_NAMES = ("ellipse", "rectangle", "triangle", "ring", "cross", "star", "crescent")
MIN_VISIBLE = 0.4  # fraction of an object's pixels that must stay visible
SIZE_RANGE = (0.08, 0.6)  # object extent as a fraction of the image side
MAX_PLACEMENT_TRIES = 20


def category_id(cls: int) -> int:
    """COCO category id of contiguous class ``cls`` (deliberately not contiguous)."""
    return 2 * cls + 1


def render_det_sample(
    rng: np.random.Generator,
    index: int,
    shape: Tuple[int, int],
    num_classes: int,
    max_objects: int,
    empty_ratio: float,
) -> Tuple[np.ndarray, List[Tuple[int, List[float], int]]]:
    """``(BGR uint8 image of shape (h, w), [(class, [x, y, w, h], visible_area), ...])``; objects
    are sized by the shorter side.

    A non-empty image ``index`` always holds class ``index % num_classes`` first.
    """
    height, width = shape
    side = min(shape)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = _background(rng, yy, xx)
    owner = np.full(shape, -1, np.int32)  # which object is visible at each pixel
    full_area: List[int] = []
    classes: List[int] = []
    count = 0 if rng.random() < empty_ratio else int(rng.integers(1, max_objects + 1))
    wanted = [index % num_classes] + [int(c) for c in rng.integers(0, num_classes, max(count - 1, 0))]
    mask = np.empty(shape, np.uint8)
    for cls in wanted[:count]:
        for _ in range(MAX_PLACEMENT_TRIES):
            extent = np.exp(rng.uniform(np.log(SIZE_RANGE[0]), np.log(SIZE_RANGE[1]))) * side
            r = extent / 2
            margin = min(r * 0.8, side / 2)
            centre = (rng.uniform(margin, width - margin), rng.uniform(margin, height - margin))
            mask[:] = 0
            SHAPES[cls](mask, centre, r, rng.uniform(0, 2 * np.pi), rng)
            inside = mask.astype(bool)
            area = int(inside.sum())
            if area < 12:
                continue
            covered = owner[inside]
            lost = np.bincount(covered[covered >= 0], minlength=len(full_area))
            visible = np.bincount(owner[owner >= 0], minlength=len(full_area))
            if np.any(visible - lost < MIN_VISIBLE * np.asarray(full_area, dtype=np.float64)):
                continue
            owner[inside] = len(full_area)
            full_area.append(area)
            classes.append(cls)
            img[inside] = _shape_fill(rng, cls + 1, num_classes + 1, yy, xx)[inside]
            break
    objects = []
    for k, cls in enumerate(classes):
        ys, xs = np.nonzero(owner == k)
        x0, y0 = int(xs.min()), int(ys.min())
        box = [float(x0), float(y0), float(xs.max() + 1 - x0), float(ys.max() + 1 - y0)]
        objects.append((cls, box, int(len(xs))))
    if rng.random() < 0.3:
        img = cv2.GaussianBlur(img, (0, 0), float(rng.uniform(0.4, 0.9)))
    img += rng.uniform(1, 5) * rng.standard_normal(shape + (1,), dtype=np.float32)
    return np.clip(img, 0, 255).astype(np.uint8), objects


def _write_split(
    root: str,
    split: str,
    count: int,
    seed: int,
    split_id: int,
    shape: Tuple[int, int],
    num_classes: int,
    max_objects: int,
    empty_ratio: float,
    categories: List[Dict[str, Any]],
) -> int:
    os.makedirs(os.path.join(root, "images", split))
    images, annotations, lines = [], [], []
    params = [cv2.IMWRITE_JPEG_QUALITY, 95]
    for i in range(count):
        rng = np.random.default_rng([seed & 0xFFFFFFFF, split_id, i])
        img, objects = render_det_sample(rng, i, shape, num_classes, max_objects, empty_ratio)
        name = f"{i:08d}.jpg"
        ok, buf = cv2.imencode(".jpg", img, params)
        if not ok:
            raise RuntimeError(f"could not encode images/{split}/{name}")
        with open(os.path.join(root, "images", split, name), "wb") as handle:
            handle.write(buf.tobytes())
        images.append({"id": i + 1, "file_name": name, "width": shape[1], "height": shape[0]})
        for cls, box, area in objects:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": category_id(cls),
                    "bbox": box,
                    "area": float(area),
                    "iscrowd": 0,
                }
            )
        lines.append(f"images/{split}/{name}\n")
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    with open(os.path.join(root, "annotations", f"instances_{split}.json"), "w", encoding="utf-8") as handle:
        strict_json.dump({"images": images, "annotations": annotations, "categories": categories}, handle)
    with open(os.path.join(root, f"{split}.txt"), "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(lines)
    return len(annotations)


@SYNTHETIC_DATA.register(name="det")
def generate_det_dataset(
    out_dir: str,
    num_train: int,
    num_val: int,
    seed: int = 0,
    image_size: Union[int, Sequence[int]] = 160,
    num_classes: int = 4,
    max_objects: int = 6,
    empty_ratio: float = 0.1,
) -> dict:
    """Draw a detection dataset into ``out_dir`` (skipped if ``out_dir/train.txt`` exists).

    Deterministic for a seed; train and val use separate random streams. Built in a temporary
    directory beside ``out_dir`` and renamed into place. Returns a summary dict.
    """
    check_setting(
        is_int(num_classes) and 1 <= num_classes <= len(CLASS_NAMES),
        "num_classes",
        f"a whole number in [1, {len(CLASS_NAMES)}]",
        num_classes,
    )
    shape = image_shape(image_size, 32)
    check_setting(is_int(max_objects) and max_objects >= 1, "max_objects", "a whole number >= 1", max_objects)
    check_setting(
        isinstance(empty_ratio, (int, float)) and 0.0 <= empty_ratio < 1.0,
        "empty_ratio",
        "in [0, 1)",
        empty_ratio,
    )
    out_dir = os.path.abspath(out_dir)
    names = list(CLASS_NAMES[:num_classes])
    categories = [{"id": category_id(k), "name": n, "supercategory": "shape"} for k, n in enumerate(names)]
    summary: Dict[str, object] = {
        "task": "det",
        "out_dir": out_dir,
        "seed": seed,
        "image_size": image_size,
        "num_classes": num_classes,
        "class_names": names,
        "category_ids": [c["id"] for c in categories],
        "image_dir": {"train": "images/train", "val": "images/val"},
        "anno_path": {"train": "annotations/instances_train.json", "val": "annotations/instances_val.json"},
    }

    def write(tmp: str) -> Dict[str, Any]:
        args = (shape, num_classes, max_objects, empty_ratio, categories)
        return {
            "num_objects": {
                "train": _write_split(tmp, "train", num_train, seed, 0, *args),
                "val": _write_split(tmp, "val", num_val, seed, 1, *args),
            }
        }

    settings = dict(
        seed=seed,
        image_size=[shape[1], shape[0]],
        num_classes=num_classes,
        max_objects=max_objects,
        empty_ratio=empty_ratio,
    )
    return build_atomically(out_dir, summary, num_train, num_val, write, settings)
