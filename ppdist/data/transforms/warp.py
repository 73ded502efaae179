"""The moving-least-squares image warps of ``RecAug``'s TIA augmentations (distort, stretch,
perspective), with the results of PaddleOCR's ``text_image_aug`` for the same control points.

Each augmentation first draws its control points (``*_points``: ``np.random``, in PaddleOCR's
order, so a seeded run draws PaddleOCR's points) and then applies ``warp_mls``, a pure function.
The map is solved backward (output pixel -> input position) with the similarity MLS deformation
on nodes every ``GRID_STEP`` pixels (and the last row/column), interpolated between the nodes as
PaddleOCR does (a cell of ``n`` pixels is spanned with weights ``k / n``, so a last, shorter cell
stops one pixel short of its far node) and sampled bilinearly with clamped coordinates; the
result is truncated to uint8. Everything is vectorised (numpy and ``cv2.remap``, no per-pixel
Python).
"""

from __future__ import annotations

from typing import Tuple

import cv2
import numpy as np

GRID_STEP = 100  # pixels between the nodes on which the MLS map is solved exactly
Points = Tuple[np.ndarray, np.ndarray]  # (source points, destination points), (K, 2) float64 (x, y)


def grid_nodes(size: int, step: int = GRID_STEP) -> np.ndarray:
    """0, step, 2*step, ... below ``size`` and the last pixel ``size - 1``."""
    nodes = np.arange(0, size, step, dtype=np.int64)
    if nodes[-1] != size - 1:
        nodes = np.append(nodes, size - 1)
    return nodes


def cell_weights(size: int, nodes: np.ndarray, step: int = GRID_STEP) -> np.ndarray:
    """(size, len(nodes)) weights from the node values to every pixel: a pixel ``k`` pixels into a
    cell of ``n`` pixels (``step``, or what is left at the end) gets ``k / n`` of the far node."""
    weights = np.zeros((size, len(nodes)))
    pos = np.arange(size)
    start = (pos // step) * step
    cell = np.where(start + step < size, step, size - start)
    near = np.searchsorted(nodes, start)
    far = np.searchsorted(nodes, np.minimum(start + step, size - 1))
    frac = (pos - start) / cell
    np.add.at(weights, (pos, near), 1.0 - frac)
    np.add.at(weights, (pos, far), frac)
    return weights


def mls_map(nodes: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Where each node (complex ``x + iy``) of the output takes its value from: the similarity MLS
    deformation sending the destination points ``dst`` to the source points ``src`` (complex).

    A node on a destination point maps to that point's source (the first such point), except when
    the first is the last point: then the deformation of the other points applies (PaddleOCR's).
    """
    exact = (dst.real[None, :] == nodes.real[:, None]) & (dst.imag[None, :] == nodes.imag[:, None])
    first = np.where(exact.any(axis=1), exact.argmax(axis=1), -1)
    used = np.ones((len(nodes), len(dst)), dtype=bool)
    used[first == len(dst) - 1, -1] = False
    dist2 = np.abs(dst[None, :] - nodes[:, None]) ** 2
    weights = np.where(used & ~exact, 1.0 / np.where(exact, 1.0, dist2), 0.0)
    total = np.maximum(weights.sum(axis=1, keepdims=True), 1e-300)
    p_star = (weights * dst[None, :]).sum(axis=1, keepdims=True) / total
    q_star = (weights * src[None, :]).sum(axis=1, keepdims=True) / total
    p_hat = dst[None, :] - p_star
    q_hat = src[None, :] - q_star
    mu = (weights * np.abs(p_hat) ** 2).sum(axis=1)
    rot = (weights * np.conj(p_hat) * q_hat).sum(axis=1) / np.where(mu > 0, mu, 1.0)
    mapped = rot * (nodes - p_star[:, 0]) + q_star[:, 0]
    snap = (first >= 0) & (first < len(dst) - 1)
    mapped[snap] = src[first[snap]]
    return mapped


def bilinear_sample(img: np.ndarray, map_x: np.ndarray, map_y: np.ndarray) -> np.ndarray:
    """``img`` sampled at (map_x, map_y) (clamped to the image), bilinear in float32, truncated to uint8.

    The four neighbours are gathered with ``cv2.remap`` at integer positions (exact) and blended in
    numpy: ``cv2.remap``'s own bilinear mode rounds positions to 1/32 pixel, several grey levels
    on a sharp edge."""
    h, w = img.shape[:2]
    x = np.clip(map_x, 0, w - 1)
    y = np.clip(map_y, 0, h - 1)
    x0 = np.floor(x)
    y0 = np.floor(y)
    fx = (x - x0).astype(np.float32)
    fy = (y - y0).astype(np.float32)
    x0, y0 = x0.astype(np.float32), y0.astype(np.float32)
    x1 = np.minimum(x0 + 1, w - 1)
    y1 = np.minimum(y0 + 1, h - 1)
    if img.ndim == 3:  # same-shape operands: numpy is slow on a trailing axis broadcast
        fx, fy = (np.repeat(f[..., None], img.shape[2], axis=2) for f in (fx, fy))

    def at(xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
        return cv2.remap(img, xx, yy, cv2.INTER_NEAREST).reshape(img.shape).astype(np.float32)

    top = at(x0, y0) * (1 - fx) + at(x1, y0) * fx
    bottom = at(x0, y1) * (1 - fx) + at(x1, y1) * fx
    return np.clip(top * (1 - fy) + bottom * fy, 0, 255).astype(np.uint8)


def warp_mls(img: np.ndarray, src_pts: np.ndarray, dst_pts: np.ndarray) -> np.ndarray:
    """Warp ``img`` so that each ``src_pts[k]`` (x, y) moves to ``dst_pts[k]``; same output size."""
    h, w = img.shape[:2]
    src = np.asarray(src_pts, np.float64)
    dst = np.asarray(dst_pts, np.float64)
    if len(src) < 2:
        return img.copy()
    ys, xs = grid_nodes(h), grid_nodes(w)
    nodes = (xs[None, :] + 1j * ys[:, None]).reshape(-1)
    mapped = mls_map(nodes, src[:, 0] + 1j * src[:, 1], dst[:, 0] + 1j * dst[:, 1])
    mapped = mapped.reshape(len(ys), len(xs)) - (xs[None, :] + 1j * ys[:, None])  # node displacements
    wy, wx = cell_weights(h, ys), cell_weights(w, xs)
    map_x = np.arange(w)[None, :] + wy @ mapped.real @ wx.T
    map_y = np.arange(h)[:, None] + wy @ mapped.imag @ wx.T
    return bilinear_sample(img, map_x, map_y)


def _corners(w: int, h: int) -> np.ndarray:
    return np.array([[0, 0], [w, 0], [w, h], [0, h]], dtype=np.float64)


def distort_points(w: int, h: int, segments: int) -> Points:
    """TIA distort: the corners jiggled inwards and the top/bottom points of ``segments - 1``
    vertical cuts moved by up to a third of a segment."""
    cut = w // segments
    thresh = max(cut // 3, 1)
    src = _corners(w, h)
    jig = np.random.randint(0, thresh, size=(4, 2))
    sign = np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]])  # move corners inwards
    src_list, dst_list = [src], [src + sign * jig]
    half = 0.5 * thresh
    for k in range(1, segments):
        pts = np.array([[cut * k, 0], [cut * k, h]], dtype=np.float64)
        src_list.append(pts)
        dst_list.append(pts + np.random.randint(0, thresh, size=(2, 2)) - half)
    return np.concatenate(src_list), np.concatenate(dst_list)


def stretch_points(w: int, h: int, segments: int) -> Points:
    """TIA stretch: ``segments - 1`` vertical cuts shifted sideways (uneven horizontal stretching)."""
    cut = w // segments
    thresh = max(cut * 4 // 5, 1)
    half = 0.5 * thresh
    src_list, dst_list = [_corners(w, h)], [_corners(w, h)]
    for k in range(1, segments):
        move = np.random.randint(0, thresh) - half
        src_list.append(np.array([[cut * k, 0], [cut * k, h]], dtype=np.float64))
        dst_list.append(np.array([[cut * k + move, 0], [cut * k + move, h]], dtype=np.float64))
    return np.concatenate(src_list), np.concatenate(dst_list)


def perspective_points(w: int, h: int) -> Points:
    """TIA perspective: the four corners pulled vertically inwards by up to half the height."""
    thresh = max(h // 2, 1)
    dy = np.random.randint(0, thresh, size=4)
    dst = np.array([[0, dy[0]], [w, dy[1]], [w, h - dy[2]], [0, h - dy[3]]], dtype=np.float64)
    return _corners(w, h), dst


def tia_distort(img: np.ndarray, segments: int) -> np.ndarray:
    return warp_mls(img, *distort_points(img.shape[1], img.shape[0], segments))


def tia_stretch(img: np.ndarray, segments: int) -> np.ndarray:
    return warp_mls(img, *stretch_points(img.shape[1], img.shape[0], segments))


def tia_perspective(img: np.ndarray) -> np.ndarray:
    return warp_mls(img, *perspective_points(img.shape[1], img.shape[0]))
