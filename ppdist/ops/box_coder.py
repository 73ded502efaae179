"""R-CNN box coding: deltas ``(dx, dy, dw, dh)`` relative to reference boxes, PaddleDetection's
``delta2bbox`` (weights divide the deltas; ``dw``/``dh`` clipped at ``log(1000 / 16)`` before the
exponential; widths without the +1 of pixel offsets)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

# the largest log-scale a decoded box may grow by: PaddleDetection's bound, 1000 / 16 times
BBOX_CLIP = math.log(1000.0 / 16)
# Cascade R-CNN's box-coder weights of its three stages (PaddleDetection's CascadeHead default)
CASCADE_BBOX_WEIGHTS = ((10.0, 10.0, 5.0, 5.0), (20.0, 20.0, 10.0, 10.0), (30.0, 30.0, 15.0, 15.0))


def delta2bbox(
    deltas: torch.Tensor,
    boxes: torch.Tensor,
    weights: Sequence[float] = (1.0, 1.0, 1.0, 1.0),
    max_shape: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Decode ``deltas`` [..., 4 * K] against ``boxes`` [..., 4] (xyxy) -> boxes [..., K, 4].

    ``weights`` ``(wx, wy, ww, wh)`` divide the deltas (R-CNN's ``[10, 10, 5, 5]``); the scale
    deltas are clipped above at ``BBOX_CLIP``. With ``max_shape`` (``[..., 2]`` = (h, w), broadcast
    against ``boxes[..., 0]``) the corners are clipped to ``[0, w]`` x ``[0, h]``.
    """
    if deltas.shape[-1] % 4:
        raise ValueError(f"delta2bbox takes deltas [..., 4 * K], got {tuple(deltas.shape)}")
    widths = (boxes[..., 2] - boxes[..., 0]).unsqueeze(-1)
    heights = (boxes[..., 3] - boxes[..., 1]).unsqueeze(-1)
    ctr_x = boxes[..., 0].unsqueeze(-1) + 0.5 * widths
    ctr_y = boxes[..., 1].unsqueeze(-1) + 0.5 * heights
    wx, wy, ww, wh = (float(w) for w in weights)
    split = deltas.reshape(*deltas.shape[:-1], -1, 4)
    dx, dy = split[..., 0] / wx, split[..., 1] / wy
    dw = (split[..., 2] / ww).clamp(max=BBOX_CLIP)
    dh = (split[..., 3] / wh).clamp(max=BBOX_CLIP)
    pred_ctr_x = dx * widths + ctr_x
    pred_ctr_y = dy * heights + ctr_y
    pred_w = torch.exp(dw) * widths
    pred_h = torch.exp(dh) * heights
    decoded = torch.stack(
        [
            pred_ctr_x - 0.5 * pred_w,
            pred_ctr_y - 0.5 * pred_h,
            pred_ctr_x + 0.5 * pred_w,
            pred_ctr_y + 0.5 * pred_h,
        ],
        dim=-1,
    )
    return decoded if max_shape is None else clip_to_shape(decoded, max_shape.unsqueeze(-2))


def clip_to_shape(boxes: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    """Clip xyxy ``boxes`` [..., 4] to ``[0, w]`` x ``[0, h]`` for ``shape`` [..., 2] = (h, w),
    broadcast against ``boxes[..., 0]`` (Paddle's ``max(min(v, size), 0)``)."""
    h, w = shape[..., 0], shape[..., 1]
    zero = boxes.new_zeros(())  # no device recorded in a traced graph
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack(
        [
            torch.maximum(torch.minimum(x1, w), zero),
            torch.maximum(torch.minimum(y1, h), zero),
            torch.maximum(torch.minimum(x2, w), zero),
            torch.maximum(torch.minimum(y2, h), zero),
        ],
        dim=-1,
    )


def bbox2delta(
    src: torch.Tensor, tgt: torch.Tensor, weights: Sequence[float] = (1.0, 1.0, 1.0, 1.0)
) -> torch.Tensor:
    """Encode ``tgt`` boxes [..., 4] against ``src`` boxes [..., 4] (xyxy) -> deltas [..., 4],
    each term multiplied by ``weights`` ``(wx, wy, ww, wh)``; widths without +1."""
    sw, sh = src[..., 2] - src[..., 0], src[..., 3] - src[..., 1]
    tw, th = tgt[..., 2] - tgt[..., 0], tgt[..., 3] - tgt[..., 1]
    wx, wy, ww, wh = (float(w) for w in weights)
    dx = wx * ((tgt[..., 0] + 0.5 * tw) - (src[..., 0] + 0.5 * sw)) / sw
    dy = wy * ((tgt[..., 1] + 0.5 * th) - (src[..., 1] + 0.5 * sh)) / sh
    return torch.stack((dx, dy, ww * torch.log(tw / sw), wh * torch.log(th / sh)), dim=-1)
