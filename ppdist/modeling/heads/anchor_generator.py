"""AnchorGenerator: R-CNN's grid anchors per FPN level, in PaddleDetection's order (per level;
inside a level row-major over the grid, then sizes, then aspect ratios at each location)."""

from __future__ import annotations

import math
from typing import List, Sequence, Union

import torch
from torch import nn

from ppdist.ops.ranges import index_range

Floats = Union[Sequence[float], Sequence[Sequence[float]]]


def _per_level(values: Floats, levels: int, key: str) -> List[List[float]]:
    """``[a, b]`` shared by every level, ``[[a, b]]`` likewise, or one list per level."""
    if not values:
        raise ValueError(f"AnchorGenerator: {key} must not be empty")
    if not isinstance(values[0], (list, tuple)):
        return [[float(v) for v in values]] * levels
    if len(values) == 1:
        return [[float(v) for v in values[0]]] * levels
    if len(values) != levels:
        raise ValueError(f"AnchorGenerator: {key} has {len(values)} lists for {levels} strides")
    return [[float(v) for v in level] for level in values]


def cell_anchors(sizes: Sequence[float], aspect_ratios: Sequence[float]) -> torch.Tensor:
    """[len(sizes) * len(aspect_ratios), 4] float32 boxes centred on 0: for each size, for each
    ratio ``h / w``, the box of area ``size ** 2`` (computed in double, as Paddle's Python)."""
    rows = []
    for size in sizes:
        for ratio in aspect_ratios:
            w = math.sqrt(size**2.0 / ratio)
            h = ratio * w
            rows.append([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0])
    return torch.tensor(rows, dtype=torch.float64).float()


class AnchorGenerator(nn.Module):
    """Anchors for FPN feature maps: level ``l`` has ``cell_anchors`` shifted to every grid
    location ``((j + offset) * stride, (i + offset) * stride)``.

    ``forward(feats)`` -> one ``[H_l * W_l * A, 4]`` float32 tensor per level (on the features'
    device, float32 also under autocast). ``variance`` is accepted for config parity (Paddle's
    proposals decode with unit variances whatever it says).
    """

    def __init__(
        self,
        anchor_sizes: Floats = (32, 64, 128, 256, 512),
        aspect_ratios: Floats = (0.5, 1.0, 2.0),
        strides: Sequence[float] = (16.0,),
        variance: Sequence[float] = (1.0, 1.0, 1.0, 1.0),
        offset: float = 0.0,
    ) -> None:
        super().__init__()
        self.strides = [float(s) for s in strides]
        self.offset = float(offset)
        self.variance = [float(v) for v in variance]
        levels = len(self.strides)
        sizes = _per_level(anchor_sizes, levels, "anchor_sizes")
        ratios = _per_level(aspect_ratios, levels, "aspect_ratios")
        cells = [cell_anchors(s, r) for s, r in zip(sizes, ratios)]
        if len({c.shape[0] for c in cells}) != 1:
            raise ValueError("AnchorGenerator: every level needs the same number of anchors per location")
        for level, cell in enumerate(cells):
            self.register_buffer(f"cell_anchors_{level}", cell, persistent=False)

    @property
    def num_anchors(self) -> int:
        """Anchors per grid location (the same on every level)."""
        return self.cell_anchors_0.shape[0]

    def cells(self) -> List[torch.Tensor]:
        """The per-level cell anchors [A, 4]."""
        return [getattr(self, f"cell_anchors_{level}") for level in range(len(self.strides))]

    def forward(self, feats: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        if len(feats) != len(self.strides):
            raise ValueError(
                f"AnchorGenerator has {len(self.strides)} strides but got {len(feats)} feature maps"
            )
        anchors = []
        for feat, stride, cell in zip(feats, self.strides, self.cells()):
            height, width = feat.shape[-2:]
            start = self.offset * stride
            xs = index_range(width, feat).float() * stride + start
            ys = index_range(height, feat).float() * stride + start
            shift_y, shift_x = torch.meshgrid(ys, xs, indexing="ij")
            shift_x, shift_y = shift_x.reshape(-1), shift_y.reshape(-1)
            shifts = torch.stack([shift_x, shift_y, shift_x, shift_y], dim=1)
            # ``cell`` is a buffer, on the model's device: no device is named (a traced graph records none)
            anchors.append((shifts[:, None, :] + cell[None]).reshape(-1, 4))
        return anchors
