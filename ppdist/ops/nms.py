"""Hard NMS inside groups (e.g. every (image, class) of a batch) all at once: torchvision's
arithmetic and order, suppression matrices per size class of groups, a few host reads per call."""

from __future__ import annotations

from typing import Callable, List, Tuple

import numpy as np
import torch

from ppdist.ops.ranges import index_range, is_graph_capture

# box pairs per suppression matrix: small enough for the CPU's caches, large enough for few GPU launches
PAIRS_PER_CHUNK = {"cpu": 2**21, "cuda": 2**25}


def torchvision_batched_nms() -> Callable[..., torch.Tensor]:
    """``torchvision.ops.batched_nms``, imported on first use: importing torchvision.ops loads
    torch._dynamo (about 3 s), which the tools' ``-h`` and the non-detection tasks do not need."""
    from torchvision.ops import batched_nms  # noqa: PLC0415  (heavy: loads torch._dynamo, about 3 s)

    return batched_nms


def float32_threshold(threshold: float) -> float:
    """The float32 ``t`` with ``iou > t`` exactly when ``iou > threshold`` in float64, for every
    float32 ``iou`` (torchvision's CPU kernel compares in double; comparing with the threshold
    rounded up to float32, e.g. 0.6, would also suppress at IoU == float32(0.6), as torchvision's
    CUDA kernel does: the only IoU at which the two kernels disagree)."""
    rounded = np.float32(threshold)
    if float(rounded) > threshold:
        rounded = np.nextafter(rounded, np.float32(-np.inf))
    return float(rounded)


def touching(boxes: torch.Tensor) -> torch.Tensor:
    """[G, K, K] bool: boxes ``i`` and ``j`` of [G, K, 4] are not strictly apart on either axis."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    apart = (x1[:, None, :] > x2[:, :, None]) | (x2[:, None, :] < x1[:, :, None])
    apart |= (y1[:, None, :] > y2[:, :, None]) | (y2[:, None, :] < y1[:, :, None])
    return ~apart


def suppression_matrix(boxes: torch.Tensor, threshold: float, empty_overlap: bool = False) -> torch.Tensor:
    """[G, K, K] bfloat16 0/1: box ``i`` comes before box ``j`` and their IoU exceeds
    ``threshold``, for float32 ``boxes`` [G, K, 4] (xyxy, each group best first). The IoU in
    torchvision's order of operations (``inter / (area_i + area_j - inter)``, no +1), so every
    decision is bit-identical to ``torchvision.ops.nms``.

    ``empty_overlap``: Paddle's NMS kernels instead, where two empty boxes (IoU 0 / 0) that touch
    suppress each other (its ``overlap <= threshold`` test is false for NaN); torchvision keeps both."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    area = (x2 - x1) * (y2 - y1)
    inter = torch.minimum(x2[:, :, None], x2[:, None, :])
    inter -= torch.maximum(x1[:, :, None], x1[:, None, :])
    inter.clamp_(min=0)
    height = torch.minimum(y2[:, :, None], y2[:, None, :])
    height -= torch.maximum(y1[:, :, None], y1[:, None, :])
    inter.mul_(height.clamp_(min=0))
    union = torch.add(area[:, :, None], area[:, None, :], out=height)
    union -= inter
    position = index_range(boxes.shape[1], boxes)
    iou = inter.div_(union)
    over = iou > float32_threshold(threshold)
    if empty_overlap:
        over |= torch.isnan(iou) & touching(boxes)
    return (over & (position[:, None] < position[None, :])).to(torch.bfloat16)


def _chunks(sizes: List[int], pairs: int) -> List[Tuple[int, int, int]]:
    """``(start, end, width)`` row ranges over groups sorted by size (largest first): at most
    ``pairs`` padded pairs each (one group at least), no group less than half the width."""
    out, start = [], 0
    while start < len(sizes) and sizes[start] > 0:
        width = sizes[start]
        end = start + 1
        while end < len(sizes) and 2 * sizes[end] > width and (end - start + 1) * width * width <= pairs:
            end += 1
        out.append((start, end, width))
        start = end
    return out


def grouped_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    groups: torch.Tensor,
    num_groups: int,
    iou_threshold: float,
    top_k: int = -1,
    empty_overlap: bool = False,
) -> torch.Tensor:
    """Which boxes survive hard NMS inside their group: a [N] bool mask for ``boxes`` [N, 4],
    ``scores`` [N] and ``groups`` [N] (integers in ``[0, num_groups)``); with ``top_k > -1`` only
    the best ``top_k`` of each group take part (equal scores in input order); ``empty_overlap``:
    see ``suppression_matrix``.

    Equal to ``torchvision.ops.nms`` on each group alone (its IoU arithmetic, its stable best-first
    order), without a loop over groups: each group's boxes become a row of a padded table, the
    suppression matrices are built per chunk of similar-sized groups, and the greedy decisions
    are the fixed point of ``keep_j = not any_i(keep_i and suppresses_ij)``, iterated on every
    chunk at once. Host reads: the group sizes, then one per round (a handful: a box's decision is
    final once those of the boxes before it are).
    """
    if is_graph_capture():
        return graph_grouped_nms(boxes, scores, groups, iou_threshold, top_k, empty_overlap)
    count = scores.shape[0]
    if count == 0:
        return scores < scores
    order = torch.argsort(scores, descending=True, stable=True)
    order = order[torch.argsort(groups[order], stable=True)]  # by group, best first, then input order
    grouped = groups[order]
    rank = index_range(count, grouped) - torch.searchsorted(grouped, grouped)  # place inside the group
    keys = index_range(num_groups, grouped)
    sizes = torch.searchsorted(grouped, keys, right=True) - torch.searchsorted(grouped, keys)
    if top_k > -1:
        sizes.clamp_(max=top_k)
    sorted_sizes, by_size = sizes.sort(descending=True, stable=True)
    host_sizes = sorted_sizes.tolist()
    width = host_sizes[0]
    if width == 0:  # top_k 0
        return scores < scores
    table = order.new_full((num_groups, width + 1), count)
    table[grouped, rank.clamp(max=width)] = order  # past ``width`` (top_k): into the spare column
    table = table[by_size, :width]  # largest groups first; ``count`` pads
    padded = torch.cat([boxes.float(), boxes.new_zeros(1, 4, dtype=torch.float32)])
    parts = []
    for start, end, size in _chunks(host_sizes, PAIRS_PER_CHUNK.get(boxes.device.type, 2**21)):
        rows = table[start:end, :size]
        parts.append((rows, rows < count, suppression_matrix(padded[rows], iou_threshold, empty_overlap)))
    keeps = [valid for _, valid, _ in parts]
    while True:
        settled = [
            valid & ~(torch.bmm(keep.unsqueeze(1).to(over.dtype), over).squeeze(1) > 0)
            for keep, (_, valid, over) in zip(keeps, parts)
        ]
        changed = torch.stack([(new != old).any() for new, old in zip(settled, keeps)]).any()
        keeps = settled
        if not changed:
            break
    kept = scores.new_zeros(count + 1, dtype=torch.bool)
    for keep, (rows, _, _) in zip(keeps, parts):
        kept[rows.reshape(-1)] = keep.reshape(-1)  # padding writes to the spare last entry
    return kept[:count]


def graph_grouped_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    groups: torch.Tensor,
    iou_threshold: float,
    top_k: int = -1,
    empty_overlap: bool = False,
) -> torch.Tensor:
    """``grouped_nms``'s mask from ``torchvision.ops.batched_nms`` (tensor operations only: ONNX's
    NonMaxSuppression, a TorchScript graph with dynamic sizes), for exported graphs. Same decisions
    (torchvision's, per group); ``top_k`` and ``empty_overlap`` have no such form."""
    if top_k > -1 or empty_overlap:
        raise ValueError("grouped_nms: top_k and empty_overlap have no exported-graph form")
    keep = torchvision_batched_nms()(boxes.float(), scores.float(), groups, iou_threshold)
    return torch.zeros_like(scores, dtype=torch.float32).index_fill(0, keep, 1.0) > 0
