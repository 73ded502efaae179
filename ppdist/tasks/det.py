"""Object detection (PP-YOLOE): the deployed module (NMS in the graph or left out) and its graph."""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Mapping, Tuple

import torch
from torch import nn

from ppdist.components import build_postprocess
from ppdist.tasks.registry import GraphSpec, Task, eval_transform_size, register_task

logger = logging.getLogger("ppdist")

INPUTS, OUTPUTS, RAW_OUTPUTS = ("image", "scale_factor"), ("bbox", "bbox_num"), ("boxes", "scores")


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


def build_det_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    """A dynamic batch and image size (the Eval size and one 64 px flatter and wider); the config's
    MultiClassNMS in the graph unless ``exclude_nms``."""
    height, width = eval_transform_size(config, (640, 640))
    nms = build_postprocess(config)  # MultiClassNMS with the config's settings and defaults
    outputs = TASK.graph_outputs(exclude_nms)
    axes = {"image": {0: "batch", 2: "height", 3: "width"}, "scale_factor": {0: "batch"}}
    axes.update(
        {"boxes": {0: "batch", 1: "anchors"}, "scores": {0: "batch", 2: "anchors"}}
        if exclude_nms
        else {"bbox": {0: "detections"}, "bbox_num": {0: "batch"}}
    )
    spec = GraphSpec(list(INPUTS), outputs, axes, [(1, 3, height, width), (2, 3, height - 64, width + 64)])
    return DetDeploy(model, nms, exclude_nms).eval(), spec


def detection_labels(config: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """``[{id, name}]`` from the Eval COCO annotation file's categories, else ``class_i``."""
    dataset = (config.get("Eval") or {}).get("dataset") or {}
    path = os.path.join(dataset.get("dataset_dir") or "", dataset.get("anno_path") or "")
    if dataset.get("anno_path") and os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            categories = json.load(handle).get("categories") or []
        return [
            {"id": int(c["id"]), "name": str(c.get("name", c["id"]))}
            for c in sorted(categories, key=lambda c: c["id"])
        ]
    num_classes = int(
        config["Global"].get("num_classes") or config["Architecture"]["Head"].get("num_classes", 80)
    )
    logger.warning(
        "Eval annotation file %s not found: detections get category ids 1..%d and names class_i; "
        "run from the folder the config's paths are relative to for the data set's ids and names",
        path or "(Eval.dataset.anno_path not set)",
        num_classes,
    )
    return [{"id": i + 1, "name": f"class_{i}"} for i in range(num_classes)]


TASK = register_task(
    Task(
        name="det",
        postprocesses=("MultiClassNMS",),
        inputs=INPUTS,
        outputs=OUTPUTS,
        raw_outputs=RAW_OUTPUTS,
        build_deploy=build_det_deploy,
        labels=detection_labels,
    )
)
