"""Box utilities on ``xyxy`` tensors (x1, y1, x2, y2), differentiable where it makes sense."""

from __future__ import annotations

import torch


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Area of ``[..., 4]`` boxes; inverted sides count as zero."""
    wh = (boxes[..., 2:] - boxes[..., :2]).clamp(min=0)
    return wh[..., 0] * wh[..., 1]


def box_centers(boxes: torch.Tensor) -> torch.Tensor:
    """Centres ``[..., 2]`` (cx, cy) of ``[..., 4]`` boxes."""
    return (boxes[..., :2] + boxes[..., 2:]) * 0.5


def pairwise_iou(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """IoU of every box in ``boxes1`` with every box in ``boxes2``.

    Shapes ``[N, 4] x [A, 4] -> [N, A]`` or batched ``[B, N, 4] x [B, A, 4] -> [B, N, A]``.
    ``eps`` is added to the union (empty boxes give IoU 0, never NaN).
    """
    if boxes1.ndim != boxes2.ndim or boxes1.ndim not in (2, 3):
        raise ValueError(
            f"pairwise_iou takes [N,4] x [A,4] or [B,N,4] x [B,A,4], "
            f"got {tuple(boxes1.shape)} and {tuple(boxes2.shape)}"
        )
    b1 = boxes1.unsqueeze(-2)  # [..., N, 1, 4]
    b2 = boxes2.unsqueeze(-3)  # [..., 1, A, 4]
    lt = torch.maximum(b1[..., :2], b2[..., :2])
    rb = torch.minimum(b1[..., 2:], b2[..., 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[..., 0] * wh[..., 1]
    union = box_area(b1) + box_area(b2) - overlap + eps
    return overlap / union


def points_inside_boxes(points: torch.Tensor, boxes: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """``[B, N, A]`` float mask: 1 where point ``a`` ([A, 2]) lies strictly inside box ``n``
    ([B, N, 4]), i.e. its smallest distance to a side exceeds ``eps``."""
    pts = points[None, None]  # [1, 1, A, 2]
    bxs = boxes.unsqueeze(2)  # [B, N, 1, 4]
    ltrb = torch.cat([pts - bxs[..., :2], bxs[..., 2:] - pts], dim=-1)
    return (ltrb.amin(dim=-1) > eps).to(boxes.dtype)


def distance2bbox(points: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """Boxes ``[..., 4]`` from points ``[..., 2]`` and ltrb distances ``[..., 4]`` (broadcasting)."""
    return torch.cat([points - distance[..., :2], points + distance[..., 2:]], dim=-1)


def bbox2distance(points: torch.Tensor, boxes: torch.Tensor, reg_max: float) -> torch.Tensor:
    """ltrb distances ``[..., 4]`` from points to box sides, clipped to ``[0, reg_max - 0.01]``
    (the DFL target range: bins ``0..reg_max``, the right bin must stay in range)."""
    dist = torch.cat([points - boxes[..., :2], boxes[..., 2:] - points], dim=-1)
    return dist.clamp(min=0.0, max=reg_max - 0.01)


def giou(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    """Generalised IoU of aligned boxes ``[..., 4]`` -> ``[...]``, in [-1, 1].

    ``eps`` is added to the union and to the enclosing area; sides are not clamped, so the
    value stays differentiable for (slightly) inverted predicted boxes.
    """
    lt = torch.maximum(boxes1[..., :2], boxes2[..., :2])
    rb = torch.minimum(boxes1[..., 2:], boxes2[..., 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[..., 0] * wh[..., 1]
    area1 = (boxes1[..., 2] - boxes1[..., 0]) * (boxes1[..., 3] - boxes1[..., 1])
    area2 = (boxes2[..., 2] - boxes2[..., 0]) * (boxes2[..., 3] - boxes2[..., 1])
    union = area1 + area2 - overlap + eps
    iou = overlap / union
    enc_lt = torch.minimum(boxes1[..., :2], boxes2[..., :2])
    enc_rb = torch.maximum(boxes1[..., 2:], boxes2[..., 2:])
    enclose = (enc_rb[..., 0] - enc_lt[..., 0]) * (enc_rb[..., 1] - enc_lt[..., 1]) + eps
    return iou - (enclose - union) / enclose
