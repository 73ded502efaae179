"""Faster R-CNN post-processing: PaddleDetection's ``BBoxPostProcess`` = ``RCNNBox`` (per-class
boxes decoded from the RoIs with ``prior_box_var``, clipped to the network input) + multi-class NMS
(``postprocess.nms.multiclass_nms_batch``, no background class: its column is dropped first) +
``get_pred`` (boxes back to the original image by ``scale_factor``, clipped to its rounded size,
empty boxes dropped)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ppdist.ops.box_coder import clip_to_shape, delta2bbox
from ppdist.postprocess.nms import (
    batched_multiclass_nms_rows,
    bbox_rows,
    box_ratio,
    detections_on_host,
    multiclass_nms_batch,
    split_by_image,
)
from ppdist.registry import POSTPROCESSES

DEFAULT_NMS = {"score_threshold": 0.05, "nms_top_k": -1, "keep_top_k": 100, "nms_threshold": 0.5}
# PaddleDetection's MultiClassNMS keys with one value here (IoU without +1; no adaptive NMS)
FIXED_NMS_KEYS = {"normalized": True, "nms_eta": 1.0, "return_index": None, "return_rois_num": None}
IGNORED_NMS_KEYS = ("name", "trt", "cpu", "return_index", "return_rois_num")


class RCNNBox:
    """Decode: ``preds`` with ``bbox_delta`` [B, R, 4 * C] (or 4: class-agnostic), ``bbox_prob``
    [B, R, C + 1], ``rois`` [B, R, 4] and ``rois_mask`` [B, R] -> per-class boxes [B, R, C, 4]
    clipped to ``im_shape`` [B, 2] (h, w) and scores [B, C, R] (background dropped; padded RoIs
    score -inf)."""

    def __init__(
        self,
        prior_box_var: Sequence[float] = (10.0, 10.0, 5.0, 5.0),
        code_type: str = "decode_center_size",
        box_normalized: bool = False,
        num_classes: int = 80,
    ) -> None:
        if code_type != "decode_center_size" or box_normalized:
            raise ValueError(
                "RCNNBox: only code_type decode_center_size with box_normalized false is supported"
            )
        self.prior_box_var = [float(v) for v in prior_box_var]
        self.num_classes = int(num_classes)

    def __call__(
        self, preds: Mapping[str, torch.Tensor], im_shape: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        rois = preds["rois"].detach().float()
        boxes = delta2bbox(preds["bbox_delta"].detach().float(), rois, self.prior_box_var)
        boxes = boxes.expand(-1, -1, self.num_classes, -1)
        boxes = clip_to_shape(boxes, im_shape.float()[:, None, None, :])
        scores = preds["bbox_prob"].detach().float()[..., :-1]
        scores = torch.where(preds["rois_mask"][..., None], scores, torch.full_like(scores, -torch.inf))
        return boxes, scores.transpose(1, 2)


def _nms_settings(nms: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """MultiClassNMS's keywords: PaddleDetection's defaults, its unsupported values rejected."""
    cfg = dict(nms or {})
    if cfg.get("name", "MultiClassNMS") != "MultiClassNMS":
        raise ValueError(f"BBoxPostProcess: nms {cfg['name']!r} is not supported; use MultiClassNMS")
    for key, value in FIXED_NMS_KEYS.items():
        if value is not None and key in cfg and cfg[key] != value:
            raise ValueError(f"BBoxPostProcess: nms.{key}={cfg[key]!r} is not supported; use {value!r}")
    unknown = set(cfg) - set(DEFAULT_NMS) - set(FIXED_NMS_KEYS) - set(IGNORED_NMS_KEYS)
    if unknown:
        raise ValueError(
            f"BBoxPostProcess: unknown nms keys {sorted(unknown)}; expected {sorted(DEFAULT_NMS)}"
        )
    return {k: cfg.get(k, v) for k, v in DEFAULT_NMS.items()}


@POSTPROCESSES.register
class BBoxPostProcess:
    """``preds`` from ``BBoxHead`` (``bbox_delta``, ``bbox_prob``, ``rois``, ``rois_mask``) and the
    batch's ``im_shape`` [B, 2] (network input h, w), ``scale_factor`` [B, 2] (sy, sx), ``im_id``
    -> one dict per image: ``im_id``, ``boxes`` (xyxy on the original image), ``scores``,
    ``labels``, on the host (``MultiClassNMS``'s format). Paddle's placeholder detection for an
    image with none (label 0, score 0) is not emitted: it changes no COCO metric."""

    host_keys = ("im_id", "scale_factor")

    def __init__(
        self,
        num_classes: int = 80,
        decode: Union[Mapping[str, Any], str, None] = "RCNNBox",
        nms: Optional[Mapping[str, Any]] = None,
        export_onnx: bool = False,
        export_eb: bool = False,
    ) -> None:
        if export_onnx or export_eb:
            raise ValueError(
                "BBoxPostProcess: export_onnx / export_eb are Paddle's export paths; not supported"
            )
        decode_cfg = {"name": decode} if isinstance(decode, str) or decode is None else dict(decode)
        if decode_cfg.pop("name", "RCNNBox") not in ("RCNNBox", None):
            raise ValueError("BBoxPostProcess: only decode RCNNBox is supported")
        decode_cfg.setdefault("num_classes", num_classes)
        self.num_classes = int(num_classes)
        self.decode = RCNNBox(**decode_cfg)
        self.nms = _nms_settings(nms)

    def nms_arguments(self) -> Tuple[float, int, float, int]:
        """``(score_threshold, nms_top_k, nms_threshold, keep_top_k)``, the NMS functions' order."""
        return tuple(self.nms[key] for key in ("score_threshold", "nms_top_k", "nms_threshold", "keep_top_k"))

    def detections(
        self, preds: Mapping[str, torch.Tensor], im_shape: torch.Tensor
    ) -> Dict[str, torch.Tensor]:
        """Decode and NMS on the network input: ``multiclass_nms_batch``'s ``image``, ``labels``,
        ``scores`` and ``boxes`` of the whole batch (each image best first)."""
        boxes, scores = self.decode(preds, im_shape.to(preds["rois"].device))
        return multiclass_nms_batch(
            scores,
            boxes,
            *self.nms_arguments(),
            empty_overlap=True,  # clipped boxes can be empty: Paddle's NMS suppresses touching ones
        )

    graph_raw_outputs = False  # per-class boxes: an exported graph keeps its NMS

    def graph_outputs(
        self,
        preds: Mapping[str, torch.Tensor],
        im_shape: torch.Tensor,
        scale_factor: torch.Tensor,
        exclude_nms: bool = False,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """An exported graph's ``(bbox [M, 6], bbox_num [B])`` (tensor operations only): decode, NMS
        (torchvision's ``batched_nms``: empty boxes never suppress each other, which changes nothing
        but which empty boxes hold ``keep_top_k`` places before they are dropped), boxes back to the
        original image, clipped, empty ones dropped, as ``__call__``."""
        if exclude_nms:
            raise ValueError("BBoxPostProcess: an exported Faster R-CNN keeps its NMS (per-class boxes)")
        boxes, scores = self.decode(preds, im_shape)
        image, labels, values, found = batched_multiclass_nms_rows(scores, boxes, *self.nms_arguments())
        ratio = scale_factor[:, :2].float()
        origin = torch.floor(im_shape / ratio + 0.5)
        found = clip_to_shape(found / box_ratio(ratio)[image], origin[image])
        nonempty = (found[:, 3] - found[:, 1] > 0) & (found[:, 2] - found[:, 0] > 0)
        return bbox_rows(
            image[nonempty], labels[nonempty], values[nonempty], found[nonempty], scores.shape[0]
        )

    def __call__(self, preds: Mapping[str, torch.Tensor], batch: Mapping[str, Any]) -> List[Dict[str, Any]]:
        num_images = preds["rois"].shape[0]
        im_shape = torch.as_tensor(batch["im_shape"]).reshape(num_images, 2).float()
        found = self.detections(preds, im_shape)
        image, labels, scores, boxes = detections_on_host(found)
        scale = batch.get("scale_factor")
        if scale is not None:
            ratio = torch.as_tensor(scale).cpu().reshape(num_images, -1)[:, :2].float()
            origin = torch.floor(im_shape.cpu() / ratio + 0.5)
            boxes = clip_to_shape(boxes / ratio[:, [1, 0, 1, 0]][image], origin[image])
        nonempty = (boxes[:, 3] - boxes[:, 1] > 0) & (boxes[:, 2] - boxes[:, 0] > 0)
        image, labels, scores, boxes = image[nonempty], labels[nonempty], scores[nonempty], boxes[nonempty]
        return split_by_image(batch, num_images, image, boxes, scores, labels)
