"""Moving-least-squares image warps used by the TIA augmentations of ``RecAug``.

Points are handled as complex numbers ``x + iy``: the best local similarity transform
``z -> a z + b`` under inverse-square-distance weights then has a closed form. The map is
solved backward (output pixel -> input position) on a coarse grid of nodes, bilinearly
interpolated to every pixel and applied with ``cv2.remap``.
"""

from __future__ import annotations

import cv2
import numpy as np

GRID_STEP = 100  # pixels between the nodes on which the MLS map is solved exactly


def _grid_nodes(size: int, step: int) -> np.ndarray:
    """0, step, 2*step, ... and the last pixel ``size - 1``."""
    nodes = np.arange(0, size, step, dtype=np.float64)
    if nodes[-1] != size - 1:
        nodes = np.append(nodes, size - 1)
    return nodes


def _interp_matrix(size: int, nodes: np.ndarray) -> np.ndarray:
    """(size, len(nodes)) weights of linear interpolation from ``nodes`` to 0..size-1."""
    eye = np.eye(len(nodes))
    pos = np.arange(size, dtype=np.float64)
    return np.stack([np.interp(pos, nodes, eye[k]) for k in range(len(nodes))], axis=1)


def mls_similarity(points: np.ndarray, ctrl_out: np.ndarray, ctrl_in: np.ndarray) -> np.ndarray:
    """Map complex ``points`` by the MLS similarity deformation sending ``ctrl_out`` to ``ctrl_in``."""
    diff = ctrl_out[None, :] - points[:, None]
    dist2 = np.abs(diff) ** 2
    exact = dist2 < 1e-12
    weights = 1.0 / np.maximum(dist2, 1e-12)
    total = weights.sum(axis=1, keepdims=True)
    p_star = (weights * ctrl_out[None, :]).sum(axis=1, keepdims=True) / total
    q_star = (weights * ctrl_in[None, :]).sum(axis=1, keepdims=True) / total
    p_hat = ctrl_out[None, :] - p_star
    q_hat = ctrl_in[None, :] - q_star
    denom = (weights * np.abs(p_hat) ** 2).sum(axis=1)
    numer = (weights * np.conj(p_hat) * q_hat).sum(axis=1)
    scale = np.where(denom > 1e-12, numer / np.where(denom > 1e-12, denom, 1.0), 1.0)
    mapped = scale * (points - p_star[:, 0]) + q_star[:, 0]
    rows, cols = np.nonzero(exact)
    mapped[rows] = ctrl_in[cols]  # a node on a control point maps exactly onto its partner
    return mapped


def warp_mls(
    img: np.ndarray, src_pts: np.ndarray, dst_pts: np.ndarray, grid_step: int = GRID_STEP
) -> np.ndarray:
    """Warp ``img`` so that each ``src_pts[k]`` (x, y) moves to ``dst_pts[k]``; same output size."""
    h, w = img.shape[:2]
    if h < 2 or w < 2:
        return img
    src = np.asarray(src_pts, np.float64)
    dst = np.asarray(dst_pts, np.float64)
    ctrl_in = src[:, 0] + 1j * src[:, 1]
    ctrl_out = dst[:, 0] + 1j * dst[:, 1]
    ys, xs = _grid_nodes(h, grid_step), _grid_nodes(w, grid_step)
    nodes = (xs[None, :] + 1j * ys[:, None]).reshape(-1)
    mapped = mls_similarity(nodes, ctrl_out, ctrl_in).reshape(len(ys), len(xs))
    wy, wx = _interp_matrix(h, ys), _interp_matrix(w, xs)
    map_x = (wy @ mapped.real @ wx.T).astype(np.float32)
    map_y = (wy @ mapped.imag @ wx.T).astype(np.float32)
    return cv2.remap(img, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def _corners(w: int, h: int) -> np.ndarray:
    return np.array([[0, 0], [w, 0], [w, h], [0, h]], dtype=np.float64)


def tia_distort(img: np.ndarray, segments: int) -> np.ndarray:
    """Jiggle the corners and the top/bottom points of ``segments`` vertical cuts."""
    h, w = img.shape[:2]
    cut = w // segments
    thresh = max(cut // 3, 1)
    src = _corners(w, h)
    jig = np.random.randint(0, thresh, size=(4, 2))
    sign = np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]])  # move corners inwards
    dst = src + sign * jig
    half = 0.5 * thresh
    src_list, dst_list = [src], [dst]
    for k in range(1, segments):
        x = cut * k
        pts = np.array([[x, 0], [x, h]], dtype=np.float64)
        move = np.random.randint(0, thresh, size=(2, 2)) - half
        src_list.append(pts)
        dst_list.append(pts + move)
    return warp_mls(img, np.concatenate(src_list), np.concatenate(dst_list))


def tia_stretch(img: np.ndarray, segments: int) -> np.ndarray:
    """Shift each of ``segments - 1`` vertical cuts sideways: uneven horizontal stretching."""
    h, w = img.shape[:2]
    cut = w // segments
    thresh = max(cut * 4 // 5, 1)
    half = 0.5 * thresh
    src_list, dst_list = [_corners(w, h)], [_corners(w, h)]
    for k in range(1, segments):
        x = cut * k
        move = np.random.randint(0, thresh) - half
        src_list.append(np.array([[x, 0], [x, h]], dtype=np.float64))
        dst_list.append(np.array([[x + move, 0], [x + move, h]], dtype=np.float64))
    return warp_mls(img, np.concatenate(src_list), np.concatenate(dst_list))


def tia_perspective(img: np.ndarray) -> np.ndarray:
    """Pull the four corners vertically towards the middle by up to half the height."""
    h, w = img.shape[:2]
    thresh = max(h // 2, 1)
    src = _corners(w, h)
    dy = np.random.randint(0, thresh, size=4)
    dst = np.array([[0, dy[0]], [w, dy[1]], [w, h - dy[2]], [0, h - dy[3]]], dtype=np.float64)
    return warp_mls(img, src, dst)
