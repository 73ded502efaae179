"""ProposalGenerator: RPN outputs -> proposals, PaddleDetection's ``generate_proposals`` per FPN
level and image (top ``pre_nms_top_n`` by objectness, decode against the anchors, clip to the
image, drop boxes under the minimum size, NMS, keep the best ``top_n``), then the levels collected
per image (the best ``post_nms_top_n`` when more survive; otherwise all, in level order).

Fixed shapes: every image's proposals come padded to one width with a validity mask, so a
training step never reads a proposal count on the host. The NMS is ``ops.grouped_nms`` over all
(image, level) groups at once (equal to ``torchvision.ops.nms`` per group); its host reads are the
only ones here: the group sizes and one per suppression round (a handful per step). In an exported
graph (a trace) every size stays dynamic and the NMS is torchvision's ``batched_nms``.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from ppdist.ops.box_coder import clip_to_shape, delta2bbox
from ppdist.ops.nms import grouped_nms
from ppdist.ops.ranges import Length, at_most, best_first, index_range, kept_first

# Paddle's generate_proposals never keeps a box narrower or lower than this, whatever min_size says
SMALLEST_SIDE = 1.0


def flatten_level(scores: torch.Tensor, deltas: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``scores`` [B, A, H, W] and ``deltas`` [B, 4A, H, W] -> [B, H*W*A] and [B, H*W*A, 4], in
    the anchors' order (location-major, then the anchor)."""
    batch = scores.shape[0]
    flat_scores = scores.permute(0, 2, 3, 1).reshape(batch, -1)
    flat_deltas = deltas.permute(0, 2, 3, 1).reshape(batch, -1, 4)
    return flat_scores, flat_deltas


def compact(keep: torch.Tensor, width: Length) -> torch.Tensor:
    """[B, width] indices of the first ``width`` entries of each row, kept ones first (in order)."""
    return kept_first(keep)[:, :width]


def gather_rows(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values`` [B, N, ...] at ``index`` [B, M] -> [B, M, ...]."""
    if values.ndim == 2:
        return torch.gather(values, 1, index)
    expanded = index.reshape(*index.shape, *([1] * (values.ndim - 2))).expand(-1, -1, *values.shape[2:])
    return torch.gather(values, 1, expanded)


def placeholder_if_empty(
    rois: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Paddle's ``generate_proposals`` answers an image and level where no box survives with one
    proposal ``(0, 0, 0, 0)`` of logit 0 (which then takes part in the collection): the same in
    the first slot of such rows."""
    empty = ~mask.any(dim=1)
    first = index_range(mask.shape[1], mask)[None, :] == 0
    placeholder = empty[:, None] & first
    rois = torch.where(placeholder[..., None], torch.zeros_like(rois), rois)
    logits = torch.where(placeholder, torch.zeros_like(logits), logits)
    return rois, logits, mask | placeholder


class ProposalGenerator:
    """PaddleDetection's ``ProposalGenerator`` settings (``train_proposal`` / ``test_proposal``).

    ``topk_after_collect``: each level keeps ``pre_nms_top_n`` boxes after NMS and only the
    collection keeps ``post_nms_top_n`` (PaddleDetection's training setting); otherwise each level
    already keeps ``post_nms_top_n``. ``eta`` (adaptive NMS) must be 1.
    """

    def __init__(
        self,
        pre_nms_top_n: int = 12000,
        post_nms_top_n: int = 2000,
        nms_thresh: float = 0.5,
        min_size: float = 0.1,
        eta: float = 1.0,
        topk_after_collect: bool = False,
    ) -> None:
        if float(eta) != 1.0:
            raise ValueError(f"ProposalGenerator: eta={eta} (adaptive NMS) is not supported; use eta: 1.0")
        if int(post_nms_top_n) <= 0:
            raise ValueError(f"ProposalGenerator: post_nms_top_n must be positive, got {post_nms_top_n}")
        self.pre_nms_top_n = int(pre_nms_top_n)
        self.post_nms_top_n = int(post_nms_top_n)
        self.nms_thresh = float(nms_thresh)
        self.min_size = float(min_size)
        self.eta = float(eta)
        self.topk_after_collect = bool(topk_after_collect)

    def _candidates(
        self, scores: torch.Tensor, deltas: torch.Tensor, anchors: torch.Tensor, im_shape: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One level: the best ``pre_nms_top_n`` decoded, clipped boxes [B, K, 4], their logits
        [B, K] (best first) and whether they pass the size filter [B, K]."""
        flat_scores, flat_deltas = flatten_level(scores, deltas)
        count = flat_scores.shape[1]
        k = count if self.pre_nms_top_n <= 0 else at_most(count, self.pre_nms_top_n)
        top_scores, top_index = torch.topk(flat_scores, k, dim=1, sorted=True)
        boxes = delta2bbox(gather_rows(flat_deltas, top_index), anchors[top_index])[..., 0, :]
        boxes = clip_to_shape(boxes, im_shape[:, None, :].to(boxes.dtype))
        smallest = max(self.min_size, SMALLEST_SIDE)
        sized = (boxes[..., 2] - boxes[..., 0] >= smallest) & (boxes[..., 3] - boxes[..., 1] >= smallest)
        return boxes, top_scores, sized

    @torch.no_grad()
    def __call__(
        self,
        scores: Sequence[torch.Tensor],
        deltas: Sequence[torch.Tensor],
        anchors: Sequence[torch.Tensor],
        im_shape: torch.Tensor,
    ) -> Dict[str, torch.Tensor]:
        """Per-level ``scores`` [B, A, H, W] (logits), ``deltas`` [B, 4A, H, W], ``anchors``
        [H*W*A, 4] and ``im_shape`` [B, 2] (h, w) -> ``rois`` [B, N, 4], ``rois_score`` [B, N]
        (logits), ``rois_mask`` [B, N] (bool; valid ones first), float32 and detached."""
        levels = [
            self._candidates(s.float(), d.float(), a.float(), im_shape.float())
            for s, d, a in zip(scores, deltas, anchors)
        ]
        kept = self._nms(levels)
        top_n = self.pre_nms_top_n if self.topk_after_collect else self.post_nms_top_n
        rois, logits, masks = [], [], []
        for (boxes, level_scores, _), keep in zip(levels, kept):
            rank = keep.long().cumsum(1) - 1
            keep = keep & (rank < top_n) if top_n > 0 else keep
            index = compact(keep, at_most(keep.shape[1], top_n) if top_n > 0 else keep.shape[1])
            level_rois, level_logits, level_mask = placeholder_if_empty(
                gather_rows(boxes, index), gather_rows(level_scores, index), gather_rows(keep, index)
            )
            rois.append(level_rois)
            logits.append(level_logits)
            masks.append(level_mask)
        if len(levels) == 1:
            return {"rois": rois[0], "rois_score": logits[0], "rois_mask": masks[0]}
        return self._collect(torch.cat(rois, 1), torch.cat(logits, 1), torch.cat(masks, 1))

    def _nms(self, levels: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> List[torch.Tensor]:
        """Hard NMS inside every (image, level): [B, K_l] bool per level (size-filtered boxes
        take part with score -inf: last in their group, so they suppress nothing)."""
        batch, num_levels = levels[0][0].shape[0], len(levels)
        boxes = torch.cat([b.reshape(-1, 4) for b, _, _ in levels])
        scores = torch.cat(
            [torch.where(v, s, torch.full_like(s, -torch.inf)).reshape(-1) for _, s, v in levels]
        )
        groups = torch.cat(
            [
                (index_range(batch, s)[:, None] * num_levels + level).expand_as(s).reshape(-1)
                for level, (_, s, _) in enumerate(levels)
            ]
        )
        kept = grouped_nms(boxes, scores, groups, batch * num_levels, self.nms_thresh)
        sizes = [s.numel() for _, s, _ in levels]
        return [k.reshape(v.shape) & v for k, (_, _, v) in zip(kept.split(sizes), levels)]

    def _collect(
        self, rois: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor
    ) -> Dict[str, torch.Tensor]:
        """Per image: the best ``post_nms_top_n`` of the levels' proposals when more than that are
        valid, else all valid ones in level order; padded to ``min(post_nms_top_n, width)``."""
        width = at_most(rois.shape[1], self.post_nms_top_n)
        count = mask.sum(1, keepdim=True)
        ranked = torch.where(mask, logits, torch.full_like(logits, -torch.inf))
        best = best_first(ranked, width)
        index = torch.where(count > self.post_nms_top_n, best, compact(mask, width))
        valid = index_range(width, count)[None, :] < count
        return {
            "rois": gather_rows(rois, index),
            "rois_score": gather_rows(logits, index),
            "rois_mask": valid,
        }
