"""Synthetic semantic-segmentation data in PaddleSeg's file-list layout.

``generate_seg_dataset`` draws random shapes over muted, textured backgrounds::

    out_dir/images/train/00000000.jpg   out_dir/labels/train/00000000.png   out_dir/train.txt
    out_dir/images/val/00000000.jpg     out_dir/labels/val/00000000.png     out_dir/val.txt
    out_dir/labels.txt                  (class names, one per line)

Class 0 is the background; class k >= 1 is one shape kind drawn in its own saturated hue
band. Labels are single-channel PNGs of class ids, with 255 in a thin band along every
boundary between classes (the ignore region). Later shapes occlude earlier ones.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Sequence, Tuple, Union

import cv2
import numpy as np

from ppdist.data.synthetic_io import build_atomically, check_setting, is_int
from ppdist.registry import SYNTHETIC_DATA

CLASS_NAMES = ("background", "ellipse", "rectangle", "triangle", "ring", "cross", "star", "crescent")
IGNORE = 255
Point = Tuple[float, float]


# ----------------------------------------------------------------------------- shapes
def _poly(mask: np.ndarray, pts: np.ndarray) -> None:
    cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)


def _regular(cx: float, cy: float, radii: np.ndarray, angle: float) -> np.ndarray:
    """Points at equal angular steps around (cx, cy), one per radius."""
    t = angle + np.arange(len(radii)) * (2 * np.pi / len(radii))
    return np.stack([cx + radii * np.cos(t), cy + radii * np.sin(t)], axis=1)


def _ellipse(mask: np.ndarray, c: Point, r: float, a: float, rng: np.random.Generator) -> None:
    axes = (int(round(r)), int(round(r * rng.uniform(0.55, 1.0))))
    cv2.ellipse(mask, (int(round(c[0])), int(round(c[1]))), axes, np.degrees(a), 0, 360, 1, -1)


def _rectangle(mask: np.ndarray, c: Point, r: float, a: float, rng: np.random.Generator) -> None:
    box = ((c[0], c[1]), (2 * r, 2 * r * rng.uniform(0.45, 0.9)), float(np.degrees(a)))
    _poly(mask, cv2.boxPoints(box))


def _triangle(mask: np.ndarray, c: Point, r: float, a: float, rng: np.random.Generator) -> None:
    pts = _regular(c[0], c[1], np.full(3, r), a)
    _poly(mask, pts + rng.uniform(-0.15 * r, 0.15 * r, pts.shape))


def _ring(mask: np.ndarray, c: Point, r: float, a: float, rng: np.random.Generator) -> None:
    centre = (int(round(c[0])), int(round(c[1])))
    cv2.circle(mask, centre, int(round(r)), 1, -1)
    cv2.circle(mask, centre, int(round(r * rng.uniform(0.45, 0.65))), 0, -1)


def _cross(mask: np.ndarray, c: Point, r: float, a: float, rng: np.random.Generator) -> None:
    arm = 2 * r * rng.uniform(0.28, 0.4)
    for extra in (0.0, 90.0):
        _poly(mask, cv2.boxPoints(((c[0], c[1]), (2 * r, arm), float(np.degrees(a)) + extra)))


def _star(mask: np.ndarray, c: Point, r: float, a: float, rng: np.random.Generator) -> None:
    radii = np.tile([r, r * rng.uniform(0.4, 0.5)], 5)
    _poly(mask, _regular(c[0], c[1], radii, a))


def _crescent(mask: np.ndarray, c: Point, r: float, a: float, rng: np.random.Generator) -> None:
    cv2.circle(mask, (int(round(c[0])), int(round(c[1]))), int(round(r)), 1, -1)
    off = r * rng.uniform(0.45, 0.6)
    bite = (int(round(c[0] + off * np.cos(a))), int(round(c[1] + off * np.sin(a))))
    cv2.circle(mask, bite, int(round(r * 0.85)), 0, -1)


SHAPES: Tuple[Callable[..., None], ...] = (_ellipse, _rectangle, _triangle, _ring, _cross, _star, _crescent)


# ----------------------------------------------------------------------------- colours, textures
def _hsv_to_bgr(h: float, s: float, v: float) -> np.ndarray:
    """One BGR colour (float32) from OpenCV-range HSV (h in [0, 180), s and v in [0, 255])."""
    px = np.array([[[h % 180, s, v]]], dtype=np.float32)
    px[..., 0] *= 2.0  # float HSV in OpenCV uses degrees
    px[..., 1:] /= 255.0
    return cv2.cvtColor(px, cv2.COLOR_HSV2BGR)[0, 0] * 255.0


def image_shape(image_size: Union[int, Sequence[int]], minimum: int) -> Tuple[int, int]:
    """``(height, width)`` of a generator's ``image_size``: a side (square) or [width, height]."""
    expected = f"a side or [width, height] of whole numbers >= {minimum}"
    sides = image_size if isinstance(image_size, (list, tuple)) else [image_size]
    check_setting(
        len(sides) in (1, 2)
        and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in sides),
        "image_size",
        expected,
        image_size,
    )
    width, height = (int(sides[0]),) * 2 if len(sides) == 1 else (int(v) for v in sides)
    check_setting(min(width, height) >= minimum, "image_size", expected, image_size)
    return height, width


def _blotches(rng: np.random.Generator, shape: Tuple[int, int]) -> np.ndarray:
    """Smooth random field in about [-1, 1] (upsampled coarse noise) of ``shape`` (h, w)."""
    k = int(rng.integers(3, 8))
    coarse = rng.standard_normal((k, k)).astype(np.float32)
    return cv2.resize(coarse, (shape[1], shape[0]), interpolation=cv2.INTER_CUBIC)


def _background(rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
    """A muted (low-saturation) textured background of ``yy``'s shape, BGR float32 (textures
    scale with the longer side)."""
    shape, side = yy.shape, max(yy.shape)
    c1 = _hsv_to_bgr(rng.uniform(0, 180), rng.uniform(0, 50), rng.uniform(60, 200))
    img = np.broadcast_to(c1, shape + (3,)).astype(np.float32)
    if rng.random() < 0.6:  # second muted colour mixed in through blotches
        c2 = _hsv_to_bgr(rng.uniform(0, 180), rng.uniform(0, 50), rng.uniform(60, 200))
        m = 1.0 / (1.0 + np.exp(-3.0 * _blotches(rng, shape)))
        img = img + (c2 - c1)[None, None, :] * m[:, :, None]
    tex = np.zeros(shape, np.float32)
    t = rng.uniform(0, 2 * np.pi)
    proj = (xx * np.cos(t) + yy * np.sin(t)) / side
    if rng.random() < 0.5:  # linear gradient
        tex += rng.uniform(-50, 50) * proj
    if rng.random() < 0.4:  # stripes
        tex += rng.uniform(5, 25) * np.sin(2 * np.pi * proj * side / rng.uniform(5, 30))
    if rng.random() < 0.5:  # blotches
        tex += rng.uniform(8, 30) * _blotches(rng, shape)
    if rng.random() < 0.6:  # grain
        tex += rng.uniform(2, 10) * rng.standard_normal(shape, dtype=np.float32)
    return img + tex[:, :, None]


def _shape_fill(
    rng: np.random.Generator, cls: int, num_classes: int, yy: np.ndarray, xx: np.ndarray
) -> np.ndarray:
    """A saturated colour in the hue band of ``cls`` with soft shading, BGR float32."""
    band = 180.0 / (num_classes - 1)
    hue = (cls - 1) * band + rng.uniform(-0.2, 0.2) * band
    colour = _hsv_to_bgr(hue, rng.uniform(160, 255), rng.uniform(140, 255))
    t = rng.uniform(0, 2 * np.pi)
    shade = rng.uniform(-30, 30) * (xx * np.cos(t) + yy * np.sin(t)) / max(yy.shape)
    return colour[None, None, :] + shade[:, :, None]


# ----------------------------------------------------------------------------- one sample
def render_seg_sample(
    rng: np.random.Generator,
    index: int,
    shape: Tuple[int, int],
    num_classes: int,
    max_shapes: int,
    ignore_border: int,
) -> Tuple[np.ndarray, np.ndarray]:
    """``(BGR uint8 image, uint8 label)`` of ``shape`` (h, w) with random shapes (sized by the
    shorter side); shape ``index % (C-1)`` comes first."""
    height, width = shape
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = _background(rng, yy, xx)
    label = np.zeros(shape, np.uint8)
    count = int(rng.integers(1, max_shapes + 1))
    classes = [1 + index % (num_classes - 1)] + [int(c) for c in rng.integers(1, num_classes, count - 1)]
    mask = np.empty(shape, np.uint8)
    for cls in classes:
        mask[:] = 0
        centre = (rng.uniform(0.1, 0.9) * width, rng.uniform(0.1, 0.9) * height)
        radius = rng.uniform(0.12, 0.3) * min(shape)
        SHAPES[cls - 1](mask, centre, radius, rng.uniform(0, 2 * np.pi), rng)
        inside = mask.astype(bool)
        img[inside] = _shape_fill(rng, cls, num_classes, yy, xx)[inside]
        label[inside] = cls
    if ignore_border > 0:  # pixels with another class within the band's half width
        r = max(1, ignore_border // 2)
        kernel = np.ones((2 * r + 1, 2 * r + 1), np.uint8)
        label[cv2.dilate(label, kernel) != cv2.erode(label, kernel)] = IGNORE
    if rng.random() < 0.3:
        img = cv2.GaussianBlur(img, (0, 0), float(rng.uniform(0.4, 0.9)))
    img += rng.uniform(1, 5) * rng.standard_normal(shape + (1,), dtype=np.float32)
    return np.clip(img, 0, 255).astype(np.uint8), label


def _write_split(
    root: str,
    split: str,
    count: int,
    seed: int,
    split_id: int,
    shape: Tuple[int, int],
    num_classes: int,
    max_shapes: int,
    ignore_border: int,
) -> None:
    for sub in ("images", "labels"):
        os.makedirs(os.path.join(root, sub, split))
    lines: List[str] = []
    params = [cv2.IMWRITE_JPEG_QUALITY, 95]
    for i in range(count):
        rng = np.random.default_rng([seed & 0xFFFFFFFF, split_id, i])
        img, label = render_seg_sample(rng, i, shape, num_classes, max_shapes, ignore_border)
        img_rel, lbl_rel = f"images/{split}/{i:08d}.jpg", f"labels/{split}/{i:08d}.png"
        for rel, arr, ext, opts in ((img_rel, img, ".jpg", params), (lbl_rel, label, ".png", [])):
            ok, buf = cv2.imencode(ext, arr, opts)
            if not ok:
                raise RuntimeError(f"could not encode {rel}")
            with open(os.path.join(root, rel), "wb") as handle:
                handle.write(buf.tobytes())
        lines.append(f"{img_rel} {lbl_rel}\n")
    with open(os.path.join(root, f"{split}.txt"), "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(lines)


@SYNTHETIC_DATA.register(name="seg")
def generate_seg_dataset(
    out_dir: str,
    num_train: int,
    num_val: int,
    seed: int = 0,
    image_size: Union[int, Sequence[int]] = 128,
    num_classes: int = 5,
    max_shapes: int = 4,
    ignore_border: int = 2,
) -> dict:
    """Draw a segmentation dataset into ``out_dir`` (skipped if ``out_dir/train.txt`` exists).

    Deterministic for a seed; train and val use separate random streams. Image ``i`` of a
    split always holds class ``1 + i % (num_classes - 1)``, so every class appears once a split
    has ``num_classes - 1`` images. Built in a temporary directory beside ``out_dir`` and
    renamed into place. Returns a summary dict.
    """
    check_setting(
        is_int(num_classes) and 2 <= num_classes <= len(CLASS_NAMES),
        "num_classes",
        f"a whole number in [2, {len(CLASS_NAMES)}]",
        num_classes,
    )
    shape = image_shape(image_size, 16)
    check_setting(is_int(max_shapes) and max_shapes >= 1, "max_shapes", "a whole number >= 1", max_shapes)
    check_setting(
        is_int(ignore_border) and ignore_border >= 0, "ignore_border", "a whole number >= 0", ignore_border
    )
    out_dir = os.path.abspath(out_dir)
    names = list(CLASS_NAMES[:num_classes])
    summary: Dict[str, object] = {
        "task": "seg",
        "out_dir": out_dir,
        "seed": seed,
        "image_size": image_size,
        "num_classes": num_classes,
        "class_names": names,
        "ignore_index": IGNORE,
    }

    def write(tmp: str) -> None:
        args = (shape, num_classes, max_shapes, ignore_border)
        _write_split(tmp, "train", num_train, seed, 0, *args)
        _write_split(tmp, "val", num_val, seed, 1, *args)
        with open(os.path.join(tmp, "labels.txt"), "w", encoding="utf-8", newline="\n") as handle:
            handle.write("".join(f"{n}\n" for n in names))

    settings = dict(
        seed=seed,
        image_size=[shape[1], shape[0]],
        num_classes=num_classes,
        max_shapes=max_shapes,
        ignore_border=ignore_border,
    )
    return build_atomically(out_dir, summary, num_train, num_val, write, settings)
