"""Semantic segmentation (PP-LiteSeg, OCRNet, SegFormer): the deployed module and its graph."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

import torch
from torch import nn

from ppdist.data.seg import CITYSCAPES_NAMES, read_class_names
from ppdist.tasks.registry import GraphSpec, Task, eval_transform_size, register_task

INPUTS, OUTPUTS = ("image",), ("logits",)


class SegDeploy(nn.Module):
    """image [N, 3, H, W] -> logits [N, K, H, W] of the main head (argmax/softmax in the runner)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out = self.model(image)
        return out[0] if isinstance(out, (list, tuple)) else out


def seg_eval_size(config: Mapping[str, Any]) -> List[int]:
    """[H, W] of a segmentation config's Eval resize (PaddleSeg's ``Resize.target_size`` is
    [w, h]), else 512x512."""
    width, height = eval_transform_size(config, (512, 512))
    return [height, width]


def build_seg_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    """A dynamic batch, height and width (the Eval size and a smaller, odd one)."""
    height, width = seg_eval_size(config)
    spec = GraphSpec(
        list(INPUTS),
        list(OUTPUTS),
        {"image": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch", 2: "height", 3: "width"}},
        [(1, 3, height, width), (2, 3, height // 2 + 32, width // 2 + 64)],
    )
    return SegDeploy(model).eval(), spec


def segmentation_labels(config: Mapping[str, Any]) -> Dict[str, Any]:
    """``{num_classes}`` from Global, else the head; with ``names`` when the Eval set has them
    (``dataset_root/labels.txt``, or Cityscapes' own): infer's overlays name the classes."""
    num_classes = int(config["Global"].get("num_classes") or config["Architecture"]["Head"]["num_classes"])
    labels: Dict[str, Any] = {"num_classes": num_classes}
    dataset = (config.get("Eval") or {}).get("dataset") or {}
    if dataset.get("name") == "CityscapesDataSet" and num_classes == len(CITYSCAPES_NAMES):
        labels["names"] = list(CITYSCAPES_NAMES)
    elif dataset.get("dataset_root"):
        names = read_class_names(str(dataset["dataset_root"]), num_classes)
        if names:
            labels["names"] = names
    return labels


TASK = register_task(
    Task(
        name="seg",
        postprocesses=("SegPostProcess",),
        inputs=INPUTS,
        outputs=OUTPUTS,
        build_deploy=build_seg_deploy,
        labels=segmentation_labels,
    )
)
