"""Eval-mode models wrapped into what an exported graph computes, one wrapper per task.

The task is read from the config's post-process (``CTCLabelDecode`` -> rec, ``MultiClassNMS`` ->
det, ``SegPostProcess`` -> seg, ``TableLabelDecode`` -> table; ``DistillationCTCLabelDecode`` -> rec
for the sub-models of a distillation model), so no task name has to be added to a config. A composite model
(``Architecture.Models``) is deployed as its deployed sub-model (``ppdist.export.submodels``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import torch
from torch import nn

from ppdist.components import build_postprocess
from ppdist.errors import ConfigError
from ppdist.export.submodels import deployed_part

TASK_BY_POSTPROCESS = {
    "CTCLabelDecode": "rec",
    "DistillationCTCLabelDecode": "rec",
    "MultiClassNMS": "det",
    "SegPostProcess": "seg",
    "TableLabelDecode": "table",
}
# names of the graph inputs and outputs per task (det: NMS in the graph / exclude_nms)
GRAPH_IO = {
    "rec": (["image"], ["probs"]),
    "seg": (["image"], ["logits"]),
    "det": (["image", "scale_factor"], ["bbox", "bbox_num"]),
    "table": (["image"], ["structure_probs", "loc_preds"]),
}
DET_RAW_OUTPUTS = ["boxes", "scores"]


def task_of(config: Mapping[str, Any]) -> str:
    """``rec``, ``det``, ``seg`` or ``table`` from ``PostProcess.name``."""
    name = (config.get("PostProcess") or {}).get("name")
    if name not in TASK_BY_POSTPROCESS:
        raise ConfigError(
            f"cannot export a model whose PostProcess.name is {name!r}; expected one of "
            f"{sorted(TASK_BY_POSTPROCESS)}"
        )
    return TASK_BY_POSTPROCESS[name]


@dataclass
class GraphSpec:
    """Inputs/outputs of an exported graph and the example sizes used to export and check it."""

    input_names: List[str]
    output_names: List[str]
    dynamic_axes: Dict[str, Dict[int, str]]
    example_shapes: List[Tuple[int, ...]]  # image shapes [N, 3, H, W]: first exports, all check


class RecDeploy(nn.Module):
    """image [N, 3, 32, W] -> softmax probabilities [N, T, C] (CTC frames)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out = self.model(image)  # CTCHead applies the softmax in eval mode
        return out[-1] if isinstance(out, (list, tuple)) else out


class SegDeploy(nn.Module):
    """image [N, 3, H, W] -> logits [N, K, H, W] of the main head (argmax/softmax in the runner)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out = self.model(image)
        return out[0] if isinstance(out, (list, tuple)) else out


class TableDeploy(nn.Module):
    """image [N, 3, H, W] (PaddingTableImage's size) -> ``structure_probs`` [N, L, C] (softmax) and
    ``loc_preds`` [N, L, R] (normalised boxes), L = max_text_length + 1: SLANet's eval forward. The
    backbone and neck are traced; the head's greedy decode (``SLAHead.decoder``) is scripted, so the
    exported graphs keep its steps as one loop (``graph_export`` traces before the ONNX export)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.backbone = model.backbone
        self.neck = model.neck
        self.flat_features = model.head.flat_features  # no parameters: (B, C, H, W) -> (B, H*W, C)
        self.decode = torch.jit.script(model.head.decoder())

    def forward(self, image: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        feats = self.backbone(image)
        feats = feats if self.neck is None else self.neck(feats)
        return self.decode(self.flat_features(feats))


class DetDeploy(nn.Module):
    """image [N, 3, H, W], scale_factor [N, 2] (h, w input/original) -> with NMS ``bbox`` [M, 6]
    (label, score, x1, y1, x2, y2 on the original image) and ``bbox_num`` [N], or without NMS
    ``boxes`` [N, A, 4] (original image) and ``scores`` [N, C, A]."""

    def __init__(self, model: nn.Module, nms: Any, exclude_nms: bool = False) -> None:
        super().__init__()
        self.model = model
        self.nms = nms  # a MultiClassNMS
        self.exclude_nms = exclude_nms

    def forward(self, image: torch.Tensor, scale_factor: torch.Tensor):
        out = self.model(image)
        ratio = torch.cat([scale_factor[:, 1:2], scale_factor[:, 0:1]], dim=1).repeat(1, 2).unsqueeze(1)
        boxes = out["boxes"] / ratio
        if self.exclude_nms:
            return boxes, out["scores"]
        return self.nms.batched(out["scores"], boxes)


def _eval_size(config: Mapping[str, Any], default: Sequence[int]) -> List[int]:
    """The Eval resize's size as the config writes it, else ``default``: [H, W] for RecResizeImg and
    PaddleDetection's Resize, [w, h] for PaddleSeg's (``_seg_eval_size``)."""
    for entry in (config.get("Eval") or {}).get("dataset", {}).get("transforms", []) or []:
        if not isinstance(entry, Mapping):
            continue
        ((name, args),) = entry.items() if len(entry) == 1 else ((None, None),)
        args = args or {}
        if name == "RecResizeImg":
            return list(args["image_shape"][1:])
        if name == "Resize" and "target_size" in args:
            size = args["target_size"]
            return [size, size] if isinstance(size, int) else list(size)
    return list(default)


def _seg_eval_size(config: Mapping[str, Any]) -> List[int]:
    """[H, W] of a segmentation config's Eval resize (PaddleSeg's ``Resize.target_size`` is
    [w, h]), else 512x512."""
    width, height = _eval_size(config, (512, 512))
    return [height, width]


def _rec_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    inputs, outputs = GRAPH_IO["rec"]
    height, width = _eval_size(config, (32, 100))
    spec = GraphSpec(
        inputs,
        outputs,
        {"image": {0: "batch", 3: "width"}, "probs": {0: "batch", 1: "frames"}},
        [(1, 3, height, width), (3, 3, height, width * 3 + 8)],
    )
    return RecDeploy(model).eval(), spec


def _seg_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    inputs, outputs = GRAPH_IO["seg"]
    height, width = _seg_eval_size(config)
    spec = GraphSpec(
        inputs,
        outputs,
        {"image": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch", 2: "height", 3: "width"}},
        [(1, 3, height, width), (2, 3, height // 2 + 32, width // 2 + 64)],
    )
    return SegDeploy(model).eval(), spec


def _det_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    inputs, outputs = GRAPH_IO["det"]
    height, width = _eval_size(config, (640, 640))
    nms = build_postprocess(config)  # MultiClassNMS with the config's settings and defaults
    outputs = DET_RAW_OUTPUTS if exclude_nms else outputs
    axes = {"image": {0: "batch", 2: "height", 3: "width"}, "scale_factor": {0: "batch"}}
    axes.update(
        {"boxes": {0: "batch", 1: "anchors"}, "scores": {0: "batch", 2: "anchors"}}
        if exclude_nms
        else {"bbox": {0: "detections"}, "bbox_num": {0: "batch"}}
    )
    spec = GraphSpec(inputs, outputs, axes, [(1, 3, height, width), (2, 3, height - 64, width + 64)])
    return DetDeploy(model, nms, exclude_nms).eval(), spec


def table_input_size(config: Mapping[str, Any]) -> List[int]:
    """[H, W] of the Eval ``PaddingTableImage.size`` (every image is padded to it), else 488x488."""
    for entry in (config.get("Eval") or {}).get("dataset", {}).get("transforms", []) or []:
        if isinstance(entry, Mapping) and "PaddingTableImage" in entry:
            return [int(v) for v in (entry["PaddingTableImage"] or {}).get("size", (488, 488))]
    return [488, 488]


def _table_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    """A fixed image size (the padded one), a dynamic batch."""
    inputs, outputs = GRAPH_IO["table"]
    height, width = table_input_size(config)
    axes = {name: {0: "batch"} for name in inputs + outputs}
    spec = GraphSpec(inputs, outputs, axes, [(1, 3, height, width), (2, 3, height, width)])
    return TableDeploy(model).eval(), spec


DEPLOY_BUILDERS = {"rec": _rec_deploy, "seg": _seg_deploy, "det": _det_deploy, "table": _table_deploy}


def build_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool = False
) -> Tuple[nn.Module, GraphSpec]:
    """The wrapper for ``config``'s task around the eval-mode ``model``, and its graph spec; for a
    composite model, around its deployed sub-model (a plain model of its own config).
    ``exclude_nms`` applies to detection only."""
    model, config = deployed_part(model, config)
    task = task_of(config)
    model.eval()
    return DEPLOY_BUILDERS[task](model, config, exclude_nms)
