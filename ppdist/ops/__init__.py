"""Tensor operations shared by models and losses (pure torch)."""

from ppdist.ops.boxes import (
    bbox2distance,
    box_area,
    box_centers,
    distance2bbox,
    giou,
    pairwise_iou,
    points_inside_boxes,
)
from ppdist.ops.ranges import index_range

__all__ = [
    "bbox2distance",
    "box_area",
    "box_centers",
    "distance2bbox",
    "giou",
    "index_range",
    "pairwise_iou",
    "points_inside_boxes",
]
