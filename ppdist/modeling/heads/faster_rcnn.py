"""FasterRCNNHead: Faster R-CNN's two stages as one ``Head`` of ``BaseModel`` (no family branch).

``BaseModel`` chains ``Backbone: ResNet`` -> ``Neck: FPN`` (or none: the C4 layout) -> this head,
which holds the registered ``rpn_head`` (``RPNHead``) and ``bbox_head`` (``BBoxHead``), built from
their config entries with what PaddleDetection's ``from_config`` derives from the shapes: the
RPN's ``in_channel`` and the box head's ``feat_channel`` from the neck's ``out_channels``, its
``feat_strides`` (the RoI extractor's scales) from this head's ``feat_strides``. In training the
proposals are sampled between the two stages by the ``bbox_assigner`` entry of ``bbox_head``
(``BBoxAssigner``, looked up in ``HEADS``), called as
``assigner(rois, rois_mask, batch) -> {"rois", "rois_mask", **targets}`` on the detached, padded
proposals and the batch's padded ground truth (``gt_bbox``, ``gt_class``, ``pad_gt_mask``).

``forward(feats, input_size, batch)`` returns one flat dict: the RPN's outputs with its proposals
renamed ``rpn_rois`` / ``rpn_rois_score`` / ``rpn_rois_mask`` (plus ``rpn_scores``, ``rpn_deltas``,
``anchors`` for the RPN loss), the box head's (``bbox_score``, ``bbox_delta``, ``bbox_prob``,
``rois``, ``rois_mask``: what ``BBoxPostProcess`` reads) and, in training, the sampler's targets.
The box head also gets ``im_shape`` and, in training, ``resample(rois, rois_mask, stage)`` (the
sampler's ``cascade_stage`` on this batch): Cascade R-CNN's ``CascadeHead`` refines its boxes
stage by stage with them; ``BBoxHead`` uses neither.
``im_shape`` is the batch's, or the input's size for a bare tensor (a deployed graph).

Weights: PaddleDetection's FasterRCNN holds ``rpn_head`` and ``bbox_head`` beside its backbone and
neck, so ``head.rpn_head.*`` / ``head.bbox_head.*`` are looked up as ``rpn_head.*`` / ``bbox_head.*``
(``paddle_names``): a model zoo ``.pdparams`` converts whole.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from ppdist.errors import ConfigError
from ppdist.modeling.paddle_names import PaddleNames
from ppdist.registry import HEADS, Registry

RPN_RENAMES = {"rois": "rpn_rois", "rois_score": "rpn_rois_score", "rois_mask": "rpn_rois_mask"}


def _entry(value: Any, where: str) -> Dict[str, Any]:
    if isinstance(value, str):
        return {"name": value}
    if not isinstance(value, Mapping) or "name" not in value:
        raise ConfigError(f"{where} must be a class name or a mapping with 'name', got {value!r}")
    return dict(value)


@HEADS.register
class FasterRCNNHead(nn.Module):
    """The RPN and the RoI box head of Faster R-CNN (module docs)."""

    paddle_names = PaddleNames(beside_stage=("rpn_head", "bbox_head"))

    @staticmethod
    def nested_entries(
        kwargs: Mapping[str, Any], where: str
    ) -> List[Tuple[Registry, Dict[str, Any], str, Tuple[str, ...]]]:
        """The two heads' entries, checked by config validation before anything is built."""
        return [
            (
                HEADS,
                _entry(kwargs.get("rpn_head", "RPNHead"), f"{where}.rpn_head"),
                f"{where}.rpn_head",
                ("in_channel",),
            ),
            (
                HEADS,
                _entry(kwargs.get("bbox_head", "BBoxHead"), f"{where}.bbox_head"),
                f"{where}.bbox_head",
                ("feat_channel", "feat_strides"),
            ),
        ]

    def __init__(
        self,
        in_channels: Any,
        rpn_head: Any = "RPNHead",
        bbox_head: Any = "BBoxHead",
        feat_strides: Sequence[float] = (4, 8, 16, 32, 64),
    ) -> None:
        super().__init__()
        where = "Architecture.Head"
        channels = in_channels[0] if isinstance(in_channels, (list, tuple)) else in_channels
        rpn = _entry(rpn_head, f"{where}.rpn_head")
        rpn.setdefault("in_channel", int(channels))
        self.rpn_head = HEADS.build(rpn, where=f"{where}.rpn_head")
        box = _entry(bbox_head, f"{where}.bbox_head")
        box.setdefault("feat_channel", int(channels))
        box.setdefault("feat_strides", [float(s) for s in feat_strides])
        assigner = box.get("bbox_assigner", "BBoxAssigner")
        self.bbox_head = HEADS.build(box, where=f"{where}.bbox_head")
        self.bbox_assigner: Optional[nn.Module] = None
        if assigner is not None:
            entry = _entry(assigner, f"{where}.bbox_head.bbox_assigner")
            # PaddleDetection injects the one global num_classes into both; here the head's count is the default
            entry.setdefault("num_classes", int(getattr(self.bbox_head, "num_classes", 80)))
            if entry["name"] in HEADS:
                self.bbox_assigner = HEADS.build(entry, where=f"{where}.bbox_head.bbox_assigner")
            self._assigner_name = entry["name"]
        self.out_channels = getattr(self.bbox_head, "out_channels", None)

    def forward(
        self,
        feats: Sequence[torch.Tensor],
        input_size: Optional[Sequence[int]] = None,
        batch: Optional[Mapping[str, Any]] = None,
    ) -> Dict[str, Any]:
        im_shape = self._im_shape(feats, input_size, batch)
        rpn = self.rpn_head(feats, im_shape)
        out: Dict[str, Any] = {RPN_RENAMES.get(k, k): v for k, v in rpn.items()}
        rois, rois_mask = rpn["rois"], rpn["rois_mask"]
        if self.training:
            if self.bbox_assigner is None:
                raise ConfigError(
                    f"Architecture.Head.bbox_head.bbox_assigner {self._assigner_name!r} is not a registered "
                    f"head part: Faster R-CNN cannot sample proposals for training"
                )
            if batch is None:
                raise ValueError("FasterRCNNHead: training needs the batch (its ground truth)")
            sampled = dict(self.bbox_assigner(rois.detach(), rois_mask, batch))
            rois, rois_mask = sampled.pop("rois"), sampled.pop("rois_mask")
            out.update(sampled)
            resample = self._resampler(batch)
        else:
            resample = None
        out.update(self.bbox_head(feats, rois, rois_mask, im_shape=im_shape, resample=resample))
        return out

    def _resampler(self, batch: Mapping[str, Any]) -> Optional[Callable[..., Dict[str, torch.Tensor]]]:
        """``resample(rois, rois_mask, stage)``: the sampler's targets of a later stage's refined
        boxes (``BBoxAssigner.cascade_stage`` on this batch), for a box head that refines them."""
        stage_targets = getattr(self.bbox_assigner, "cascade_stage", None)
        if stage_targets is None:
            return None
        return lambda rois, rois_mask, stage: stage_targets(rois, rois_mask, batch, stage)

    @staticmethod
    def _im_shape(
        feats: Sequence[torch.Tensor], input_size: Optional[Sequence[int]], batch: Optional[Mapping[str, Any]]
    ) -> torch.Tensor:
        """``[B, 2]`` (h, w) of each image: the batch's ``im_shape``, else the input's size."""
        first = feats[0]
        if batch is not None and batch.get("im_shape") is not None:
            shape = batch["im_shape"]
            shape = shape if isinstance(shape, torch.Tensor) else torch.as_tensor(shape)
            if shape.device != first.device:  # a host entry; a traced graph's is on the device already
                shape = shape.to(first.device)
            return shape.float().reshape(first.shape[0], 2)
        if input_size is None:
            raise ValueError("FasterRCNNHead: needs the batch's im_shape or the input size")
        size = first.new_empty((first.shape[0], 2), dtype=torch.float32)  # filled on the device:
        size[:, 0], size[:, 1] = float(input_size[0]), float(input_size[1])  # no host-to-device copy
        return size
