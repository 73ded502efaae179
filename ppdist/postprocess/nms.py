"""PP-YOLOE post-processing: multi-class NMS (Paddle's ``multiclass_nms3`` semantics), boxes
mapped back to the original image.

Three forms of one algorithm: ``multiclass_nms`` (one image, on torchvision's ``batched_nms``),
``multiclass_nms_batch`` (a whole batch at once, equal to the first per image; what evaluation runs)
and ``batched_multiclass_nms`` (tensor operations only, for exported graphs)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

import torch

from ppdist.ops.nms import grouped_nms, torchvision_batched_nms
from ppdist.ops.ranges import Length, at_most, index_range
from ppdist.registry import POSTPROCESSES


def per_class_top_k(scores: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` best-scoring entries of every class (score order inside a class)."""
    order = torch.argsort(scores, descending=True, stable=True)
    order = order[torch.argsort(labels[order], stable=True)]  # grouped by class, best first
    sorted_labels = labels[order]
    starts = torch.searchsorted(sorted_labels, sorted_labels, right=False)
    rank = torch.arange(order.numel(), device=order.device) - starts
    return order[rank < k]


def multiclass_nms(
    scores: torch.Tensor,
    boxes: torch.Tensor,
    score_threshold: float,
    nms_top_k: int,
    nms_threshold: float,
    keep_top_k: int,
) -> Dict[str, torch.Tensor]:
    """One image: ``scores`` [C, A], ``boxes`` [A, 4] -> kept ``boxes``, ``scores``, ``labels``.

    Per class: scores strictly above ``score_threshold``, the best ``nms_top_k``, hard NMS at
    ``nms_threshold`` (no +1 in areas); then the best ``keep_top_k`` over all classes. Equal scores
    rank by class, then anchor.
    """
    labels, anchors = torch.nonzero(scores > score_threshold, as_tuple=True)
    values = scores[labels, anchors]
    if nms_top_k > -1 and values.numel():
        keep = per_class_top_k(values, labels, nms_top_k)
        labels, anchors, values = labels[keep], anchors[keep], values[keep]
    candidate_boxes = boxes[anchors].float()
    keep = torchvision_batched_nms()(candidate_boxes, values.float(), labels, nms_threshold).sort().values
    # best first; equal scores in candidate order (by class, then anchor): batched_nms's own order of
    # equal scores depends on its path (past 1000 boxes on the CPU an unstable sort)
    keep = keep[torch.argsort(values[keep], descending=True, stable=True)]
    if keep_top_k > -1:
        keep = keep[:keep_top_k]
    return {"boxes": candidate_boxes[keep], "scores": values[keep].float(), "labels": labels[keep]}


def multiclass_nms_batch(
    scores: torch.Tensor,
    boxes: torch.Tensor,
    score_threshold: float,
    nms_top_k: int,
    nms_threshold: float,
    keep_top_k: int,
    empty_overlap: bool = False,
) -> Dict[str, torch.Tensor]:
    """``multiclass_nms`` of every image at once: ``scores`` [B, C, A], ``boxes`` [B, A, 4] (or
    per-class boxes [B, A, C, 4], R-CNN's) ->
    ``image`` [M], ``labels`` [M], ``scores`` [M] and ``boxes`` [M, 4] (float32) of the kept
    detections, by image, each image best first (equal scores by class, then anchor).

    Equal to ``multiclass_nms`` per image (``torchvision.ops.nms`` per class: its IoU arithmetic
    and order), without a loop over images or classes: ``ops.grouped_nms`` over the (image, class)
    groups. Host reads per batch: the candidates (``nonzero``), the group sizes, one per
    suppression round (a handful) and the kept rows; ``empty_overlap``: Paddle's rule for two
    touching empty boxes (``ops.nms.suppression_matrix``); the per-image version reads ~5 per image, and
    torchvision's ``batched_nms`` loops over the classes (2 reads each) past 1000 boxes on the CPU
    (5000 on CUDA).
    """
    image, label, anchor = torch.nonzero(scores > score_threshold, as_tuple=True)  # by image, class, anchor
    values = scores[image, label, anchor].float()
    candidates = (boxes[image, anchor, label] if boxes.ndim == 4 else boxes[image, anchor]).float()
    if values.shape[0]:
        groups, num_groups = image * scores.shape[1] + label, scores.shape[0] * scores.shape[1]
        kept = grouped_nms(candidates, values, groups, num_groups, nms_threshold, nms_top_k, empty_overlap)
    else:
        kept = values < values  # nothing to keep
    order = torch.argsort(values, descending=True, stable=True)
    order = order[torch.argsort(image[order], stable=True)]  # by image, best first, then class and anchor
    kept = kept[order]
    if keep_top_k > -1:
        taken = kept.long().cumsum(0)
        ordered_image = image[order]
        first = torch.searchsorted(ordered_image, ordered_image)
        before = taken[first] - kept[first].long()  # kept by earlier images
        kept = kept & (taken - before <= keep_top_k)
    chosen = order[kept]
    return {
        "image": image[chosen],
        "labels": label[chosen],
        "scores": values[chosen],
        "boxes": candidates[chosen],
    }


def batched_multiclass_nms(
    scores: torch.Tensor,
    boxes: torch.Tensor,
    score_threshold: float,
    nms_top_k: int,
    nms_threshold: float,
    keep_top_k: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``multiclass_nms`` for a whole batch with tensor operations only (traceable to ONNX with a
    dynamic batch and anchor count, as PaddleDetection's exported ``multiclass_nms3``).

    ``scores`` [B, C, A], ``boxes`` [B, A, 4] (or per-class boxes [B, A, C, 4]) -> ``bbox`` [M, 6]
    rows ``(label, score, x1, y1, x2, y2)`` grouped by image in batch order, best first, and
    ``bbox_num`` [B] rows per image.
    """
    rows = batched_multiclass_nms_rows(scores, boxes, score_threshold, nms_top_k, nms_threshold, keep_top_k)
    return bbox_rows(*rows, batch=scores.shape[0])


def batched_multiclass_nms_rows(
    scores: torch.Tensor,
    boxes: torch.Tensor,
    score_threshold: float,
    nms_top_k: int,
    nms_threshold: float,
    keep_top_k: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``batched_multiclass_nms``'s kept detections as ``(image, labels, scores, boxes)`` [M], [M],
    [M], [M, 4]: by image, each image best first (tensor operations only)."""
    batch, num_classes, num_anchors = scores.shape
    k = num_anchors if nms_top_k < 0 else at_most(num_anchors, nms_top_k)
    top_scores, top_anchors = torch.topk(scores, k, dim=2)  # [B, C, k] per class, best first
    image, label, slot = torch.nonzero(top_scores > score_threshold, as_tuple=True)
    values = top_scores[image, label, slot]
    anchors = top_anchors[image, label, slot]
    candidates = (boxes[image, anchors, label] if boxes.ndim == 4 else boxes[image, anchors]).float()
    keep = torchvision_batched_nms()(candidates, values.float(), image * num_classes + label, nms_threshold)
    image, label, values, candidates = image[keep], label[keep], values[keep].float(), candidates[keep]
    position = index_range(image.shape[0], image)  # kept boxes come best first
    order = torch.argsort(image * image.shape[0] + position)  # by image, best first; unique keys, exact
    image, label, values, candidates = image[order], label[order], values[order], candidates[order]
    if keep_top_k > -1:
        kept = rank_in_image(image, batch) < keep_top_k
        image, label, values, candidates = image[kept], label[kept], values[kept], candidates[kept]
    return image, label, values, candidates


def box_ratio(scale_factor: torch.Tensor) -> torch.Tensor:
    """[B, 2] ``scale_factor`` (h, w input/original) -> [B, 4] (w, h, w, h): xyxy boxes divided by
    it go back to the original image (tensor operations only)."""
    return torch.cat([scale_factor[:, 1:2], scale_factor[:, 0:1]], dim=1).repeat(1, 2)


def rank_in_image(image: torch.Tensor, batch: Length) -> torch.Tensor:
    """Each row's place among the rows of its image (``image`` [M] sorted), tensor operations only."""
    one_hot = (image.unsqueeze(1) == index_range(batch, image)).long()  # [M, B]
    return (one_hot.cumsum(0) * one_hot).sum(1) - 1


def bbox_rows(
    image: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor, boxes: torch.Tensor, batch: Length
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Detections ordered by image -> PaddleDetection's exported ``bbox`` [M, 6] rows ``(label,
    score, x1, y1, x2, y2)`` and ``bbox_num`` [B] (tensor operations only)."""
    bbox = torch.cat([labels.unsqueeze(1).float(), scores.unsqueeze(1).float(), boxes.float()], dim=1)
    counts = (image.unsqueeze(1) == index_range(batch, image)).long().sum(0)
    return bbox, counts


@POSTPROCESSES.register
class MultiClassNMS:
    """``preds``: ``{"scores": [B, C, A], "boxes": [B, A, 4]}`` on the network input; the batch's
    ``scale_factor`` [B, 2] = (h, w) input/original ratios maps the boxes back (no clipping).
    Returns one dict per image: ``im_id``, ``boxes`` (xyxy), ``scores``, ``labels``, on the host.

    The whole batch goes through ``multiclass_nms_batch`` and its detections cross to the host in
    one transfer; ``host_keys``: the batch entries the evaluator leaves on the host for it."""

    host_keys = ("im_id", "scale_factor")

    def __init__(
        self,
        score_threshold: float = 0.01,
        nms_top_k: int = 1000,
        keep_top_k: int = 300,
        nms_threshold: float = 0.7,
    ) -> None:
        self.score_threshold = float(score_threshold)
        self.nms_top_k = int(nms_top_k)
        self.keep_top_k = int(keep_top_k)
        self.nms_threshold = float(nms_threshold)

    graph_raw_outputs = True  # an exported graph may leave the NMS out (``boxes``, ``scores``)

    def graph_outputs(
        self,
        preds: Mapping[str, torch.Tensor],
        im_shape: torch.Tensor,
        scale_factor: torch.Tensor,
        exclude_nms: bool = False,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """An exported graph's outputs (tensor operations only): ``(bbox [M, 6], bbox_num [B])`` on
        the original images, or without NMS ``(boxes [B, A, 4], scores [B, C, A])``; ``im_shape``
        (the network input's h, w) is not needed here."""
        del im_shape
        boxes = preds["boxes"] / box_ratio(scale_factor).unsqueeze(1)
        if exclude_nms:
            return boxes, preds["scores"]
        return self.batched(preds["scores"], boxes)

    def batched(self, scores: torch.Tensor, boxes: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``batched_multiclass_nms`` with these settings: ``(bbox [M, 6], bbox_num [B])``."""
        return batched_multiclass_nms(
            scores, boxes, self.score_threshold, self.nms_top_k, self.nms_threshold, self.keep_top_k
        )

    def __call__(self, preds: Mapping[str, torch.Tensor], batch: Mapping[str, Any]) -> List[Dict[str, Any]]:
        num_images = preds["scores"].shape[0]
        found = multiclass_nms_batch(
            preds["scores"],
            preds["boxes"],
            self.score_threshold,
            self.nms_top_k,
            self.nms_threshold,
            self.keep_top_k,
        )
        image, labels, scores, boxes = detections_on_host(found)
        scale = batch.get("scale_factor")
        if scale is not None:  # (h, w) per image -> (w, h, w, h) per box
            ratio = torch.as_tensor(scale).cpu().reshape(num_images, -1)[:, :2].float()
            boxes = boxes / ratio[:, [1, 0, 1, 0]][image]
        return split_by_image(batch, num_images, image, boxes, scores, labels)


def split_by_image(
    batch: Mapping[str, Any],
    num_images: int,
    image: torch.Tensor,
    boxes: torch.Tensor,
    scores: torch.Tensor,
    labels: torch.Tensor,
) -> List[Dict[str, Any]]:
    """One ``{boxes, scores, labels, im_id}`` per image from detections ordered by ``image`` (the
    batch's ``im_id``, else the image's position)."""
    ids = batch.get("im_id")
    ids = (
        torch.as_tensor(ids).cpu().reshape(num_images, -1)[:, 0].tolist()
        if ids is not None
        else range(num_images)
    )
    counts = torch.bincount(image, minlength=num_images).tolist()
    return [
        {"boxes": b, "scores": s, "labels": c, "im_id": int(i)}
        for b, s, c, i in zip(boxes.split(counts), scores.split(counts), labels.split(counts), ids)
    ]


def detections_on_host(found: Mapping[str, torch.Tensor]) -> Tuple[torch.Tensor, ...]:
    """``(image, labels, scores, boxes)`` of batched detections, brought to the host in one transfer."""
    columns = [found["image"], found["labels"], found["scores"]]
    rows = torch.cat([c.double().unsqueeze(1) for c in columns] + [found["boxes"].double()], dim=1).cpu()
    return rows[:, 0].long(), rows[:, 1].long(), rows[:, 2].float(), rows[:, 3:].float()
