"""Object detection (PP-YOLOE, Faster R-CNN): everything of the task outside the model: the
deployed module and its graph, labels, the inference runner and result writer, the synthetic
benchmark set."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
from torch import nn

from ppdist.components import build_postprocess
from ppdist.data.synthetic_det import generate_det_dataset
from ppdist.errors import ConfigError
from ppdist.ops.ranges import size_of
from ppdist.tasks.registry import (
    BenchmarkData,
    BrowsePanel,
    GraphSpec,
    Task,
    eval_transform_size,
    register_task,
)
from ppdist.tasks.runner import (
    Outputs,
    Result,
    Runner,
    Sample,
    build_postprocess_of,
)
from ppdist.utils import strict_json
from ppdist.utils.atomic import write_text_atomic
from ppdist.visualize.palette import class_colour

logger = logging.getLogger("ppdist")

INPUTS, OUTPUTS, RAW_OUTPUTS = ("image", "scale_factor"), ("bbox", "bbox_num"), ("boxes", "scores")


class DetDeploy(nn.Module):
    """image [N, 3, H, W], scale_factor [N, 2] (h, w input/original) -> with NMS ``bbox`` [M, 6]
    (label, score, x1, y1, x2, y2 on the original image) and ``bbox_num`` [N], or without NMS
    ``boxes`` [N, A, 4] (original image) and ``scores`` [N, C, A].

    The model gets the batch ``{"image", "im_shape"}`` (every image's h, w: the input's size);
    the config's post-process (``MultiClassNMS``, ``BBoxPostProcess``) makes the outputs with its
    ``graph_outputs``."""

    def __init__(self, model: nn.Module, postprocess: Any, exclude_nms: bool = False) -> None:
        super().__init__()
        self.model = model
        self.postprocess = postprocess
        self.exclude_nms = exclude_nms

    def forward(self, image: torch.Tensor, scale_factor: torch.Tensor):
        height, width = (size_of(image.shape[axis], scale_factor) for axis in (2, 3))
        im_shape = torch.zeros_like(scale_factor) + torch.stack([height, width])  # [N, 2], sizes dynamic
        out = self.model({"image": image, "im_shape": im_shape})
        return self.postprocess.graph_outputs(out, im_shape, scale_factor, self.exclude_nms)


def build_det_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool
) -> Tuple[nn.Module, GraphSpec]:
    """A dynamic batch and image size (the Eval size and one 64 px flatter and wider); the config's
    MultiClassNMS in the graph unless ``exclude_nms``."""
    height, width = eval_transform_size(config, (640, 640))
    postprocess = build_postprocess(config)  # MultiClassNMS / BBoxPostProcess with the config's settings
    if exclude_nms and not postprocess.graph_raw_outputs:
        raise ConfigError(
            f"--exclude_nms: PostProcess {config['PostProcess']['name']} keeps its NMS in the graph "
            "(per-class boxes); export without --exclude_nms"
        )
    outputs = TASK.graph_outputs(exclude_nms)
    axes = {"image": {0: "batch", 2: "height", 3: "width"}, "scale_factor": {0: "batch"}}
    axes.update(
        {"boxes": {0: "batch", 1: "anchors"}, "scores": {0: "batch", 2: "anchors"}}
        if exclude_nms
        else {"bbox": {0: "detections"}, "bbox_num": {0: "batch"}}
    )
    spec = GraphSpec(list(INPUTS), outputs, axes, [(1, 3, height, width), (2, 3, height - 64, width + 64)])
    return DetDeploy(model, postprocess, exclude_nms).eval(), spec


def nms_can_leave_the_graph(config: Mapping[str, Any]) -> bool:
    """Whether the config's post-process has raw graph outputs (MultiClassNMS: yes; BBoxPostProcess:
    no, its boxes are per class)."""
    return bool(build_postprocess(config).graph_raw_outputs)


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


class DetRunner(Runner):
    """Images -> ``{path, boxes [K, 4] xyxy on the original image, scores, labels, category_ids}``."""

    task = "det"

    def __init__(self, info: Mapping[str, Any]) -> None:
        super().__init__(info)
        self.labels: List[Dict[str, Any]] = list(info.get("labels") or [])
        self.nms = build_postprocess_of(info)  # MultiClassNMS

    def finish(self, data: Sample) -> Sample:
        return {
            "img_path": data["img_path"],
            "image": data["image"],
            "scale_factor": np.asarray(data["scale_factor"], dtype=np.float32).reshape(2),
            "ori_shape": tuple(int(v) for v in np.asarray(data["ori_shape"]).reshape(2)),
        }

    def batch(self, samples: Sequence[Sample]) -> Dict[str, np.ndarray]:
        inputs = super().batch(samples)
        inputs["scale_factor"] = np.stack([s["scale_factor"] for s in samples]).astype(np.float32)
        return inputs

    def _bbox(self, outputs: Outputs) -> Tuple[np.ndarray, np.ndarray]:
        """(bbox [M, 6], bbox_num [N]); a graph exported with exclude_nms gets NMS here."""
        if "bbox" in outputs:
            return np.asarray(outputs["bbox"]), np.asarray(outputs["bbox_num"])
        bbox, num = self.nms.batched(torch.from_numpy(outputs["scores"]), torch.from_numpy(outputs["boxes"]))
        return bbox.numpy(), num.numpy()

    def category_id(self, label: int) -> int:
        return int(self.labels[label]["id"]) if 0 <= label < len(self.labels) else label

    def label_name(self, label: int) -> str:
        return str(self.labels[label]["name"]) if 0 <= label < len(self.labels) else str(label)

    def postprocess(self, outputs: Outputs, samples: Sequence[Sample]) -> List[Result]:
        bbox, nums = self._bbox(outputs)
        results, start = [], 0
        for sample, num in zip(samples, nums.reshape(-1).tolist()):
            rows = bbox[start : start + int(num)]
            start += int(num)
            labels = rows[:, 0].astype(np.int64)
            results.append(
                {
                    "path": sample["img_path"],
                    "boxes": rows[:, 2:6].astype(np.float32),
                    "scores": rows[:, 1].astype(np.float32),
                    "labels": labels,
                    "category_ids": np.array([self.category_id(int(v)) for v in labels], dtype=np.int64),
                }
            )
        return results


class DetWriter:
    """COCO results in ``output_dir/bbox.json`` (image_id = running index, plus ``file_name``) and
    each image with its boxes above ``draw_threshold`` drawn, as ``output_dir/<name>``, in the
    colours browse_dataset gives the classes (``ppdist.visualize.palette``)."""

    def __init__(
        self, output_dir: str, labels: Sequence[Mapping[str, Any]], draw_threshold: float = 0.5
    ) -> None:
        self.output_dir = output_dir
        self.names = {int(row["id"]): str(row["name"]) for row in labels}
        self.classes = {cat: index for index, cat in enumerate(sorted(self.names))}  # browse's class index
        self.draw_threshold = draw_threshold
        self.records: List[Dict[str, Any]] = []
        self.images = 0
        self.drawn: List[str] = []

    def add(self, results: Sequence[Result]) -> None:
        for r in results:
            image_id = self.images
            self.images += 1
            for box, score, cat in zip(r["boxes"].tolist(), r["scores"].tolist(), r["category_ids"].tolist()):
                x1, y1, x2, y2 = box
                self.records.append(
                    {
                        "image_id": image_id,
                        "file_name": os.path.basename(r["path"]),
                        "category_id": int(cat),
                        "bbox": [x1, y1, x2 - x1, y2 - y1],
                        "score": float(score),
                    }
                )
            self.drawn.append(self.draw(r))

    def draw(self, result: Result) -> str:
        image = cv2.imread(result["path"], cv2.IMREAD_COLOR)
        for box, score, cat in zip(
            result["boxes"].tolist(), result["scores"].tolist(), result["category_ids"].tolist()
        ):
            if score < self.draw_threshold:
                continue
            index = self.classes.get(int(cat))
            r, g, b = class_colour(index) if index is not None else (0, 255, 0)
            x1, y1, x2, y2 = (int(round(v)) for v in box)
            cv2.rectangle(image, (x1, y1), (x2, y2), (b, g, r), 2)
            text = f"{self.names.get(int(cat), cat)} {score:.2f}"
            cv2.putText(
                image, text, (x1, max(y1 - 4, 10)), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (b, g, r), 1, cv2.LINE_AA
            )
        path = os.path.join(self.output_dir, os.path.basename(result["path"]))
        cv2.imwrite(path, image)
        return path

    def close(self) -> List[str]:
        path = os.path.join(self.output_dir, "bbox.json")
        write_text_atomic(path, strict_json.dumps(self.records))
        return [path] + self.drawn

    def abort(self) -> None:
        """Nothing to drop: ``bbox.json`` is written only by ``close()``."""


def det_writer(output_dir: str, info: Mapping[str, Any], draw_threshold: float) -> "DetWriter":
    """``bbox.json`` and the boxes over ``draw_threshold`` drawn, named by the info's labels."""
    return DetWriter(output_dir, info.get("labels") or [], draw_threshold)


BENCHMARK_IMAGE_SIZE = (640, 480)  # [width, height]: COCO's typical size


def _benchmark_entry(data_dir: str, split: str, old: Mapping[str, Any]) -> Dict[str, Any]:
    """The COCO layout of ``generate_det_dataset`` (``COCODataSet``)."""
    entry = {k: v for k, v in old.items() if k not in ("dataset_dir", "image_dir", "anno_path")}
    entry.update(
        dataset_dir=data_dir, image_dir=f"images/{split}", anno_path=f"annotations/instances_{split}.json"
    )
    return entry


BENCHMARK_DATA = BenchmarkData(
    folder=lambda images: f"det_{BENCHMARK_IMAGE_SIZE[0]}x{BENCHMARK_IMAGE_SIZE[1]}_{images}",
    generate=lambda data_dir, images: generate_det_dataset(
        data_dir, images, images, image_size=list(BENCHMARK_IMAGE_SIZE), empty_ratio=0.0
    ),
    dataset_entry=_benchmark_entry,
)


def annotation_boxes(raw: Mapping[str, Any], batch: Mapping[str, Any]) -> Tuple[np.ndarray, np.ndarray]:
    """A detection sample's annotated boxes (xyxy) and classes in its transformed image, for an
    eval pipeline that keeps no boxes: scaled by the batch's ``scale_factor`` ([sy, sx]), which
    is what eval pipelines do to an image (resize only); crowd boxes left out."""
    boxes = np.asarray(raw["gt_bbox"], np.float32).reshape(-1, 4)
    classes = np.asarray(raw["gt_class"], np.int64).reshape(-1)
    crowd = np.asarray(raw.get("is_crowd", np.zeros(len(boxes))), np.int64).reshape(-1) > 0
    scale = np.ones(2, np.float32)
    if "scale_factor" in batch:
        scale = np.asarray(batch["scale_factor"][0], np.float32).reshape(2)
    boxes = boxes * np.array([scale[1], scale[0], scale[1], scale[0]], np.float32)
    return boxes[~crowd], classes[~crowd]


def browse_targets(
    reader: Any, batch: Mapping[str, Any], sample: Any, draw: bool, raw: Optional[Mapping[str, Any]]
) -> None:
    """The boxes and classes the model gets (PadGT's padding rows left out); an eval pipeline keeps
    none (the metric reads the annotations): the annotated ones, scaled (``annotation_boxes``)."""
    if "gt_bbox" not in batch:
        sample.boxes, sample.classes = np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
        if raw is not None:
            sample.boxes, sample.classes = annotation_boxes(raw, batch)
        return
    boxes = batch["gt_bbox"][0].reshape(-1, 4).numpy()
    classes = batch["gt_class"][0].reshape(-1).numpy().astype(np.int64)
    real = np.ones(len(boxes), bool)
    if "pad_gt_mask" in batch:  # PadGT's padding rows are no boxes
        real = batch["pad_gt_mask"][0].reshape(-1).numpy() > 0
    sample.boxes, sample.classes = boxes[real], classes[real]


def browse_summary(browse: Any, counted: Sequence[Any]) -> Dict[str, Any]:
    """Boxes in all, per class (named) and per image."""
    names = browse.class_names
    per_class = Counter(int(c) for s in counted for c in s.classes)
    return {
        "boxes": sum(per_class.values()),
        "boxes_per_class": {
            (names[c] if 0 <= c < len(names) else str(c)): n for c, n in sorted(per_class.items())
        },
        "boxes_per_image": dict(sorted(Counter(len(s.boxes) for s in counted).items())),
    }


BROWSE_PANEL = BrowsePanel(browse_targets, browse_summary, panel_px=(320, 320), columns=4, rows_per_page=3)


def training_sample(config: Mapping[str, Any], size: Tuple[int, int], index: int) -> Dict[str, torch.Tensor]:
    """An image with 2-5 random boxes, padded to 6 ground truths (``pad_gt_mask``)."""
    generator = torch.Generator().manual_seed(index)
    height, width = size
    image = torch.randn(3, height, width, generator=generator)
    classes = config["Global"].get("num_classes") or config["Architecture"]["Head"]["num_classes"]
    boxes, count = 6, 2 + index % 4
    xy = torch.rand(boxes, 2, generator=generator) * torch.tensor([width * 0.6, height * 0.6])
    wh = (0.1 + 0.3 * torch.rand(boxes, 2, generator=generator)) * torch.tensor([width, height])
    real = (torch.arange(boxes) < count).float().unsqueeze(-1)
    return {
        "image": image,
        "gt_bbox": torch.cat([xy, xy + wh], dim=-1) * real,
        "gt_class": torch.randint(0, classes, (boxes, 1), generator=generator) * real.long(),
        "pad_gt_mask": real,
    }


TASK = register_task(
    Task(
        name="det",
        postprocesses=("MultiClassNMS", "BBoxPostProcess"),
        inputs=INPUTS,
        outputs=OUTPUTS,
        raw_outputs=RAW_OUTPUTS,
        runner=DetRunner,
        writer=det_writer,
        benchmark_data=BENCHMARK_DATA,
        training_sample=training_sample,
        browse=BROWSE_PANEL,
        build_deploy=build_det_deploy,
        labels=detection_labels,
        raw_graph=nms_can_leave_the_graph,
    )
)
