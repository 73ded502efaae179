"""Semantic segmentation (PP-LiteSeg, OCRNet, SegFormer): everything of the task outside the model: the
deployed module and its graph, labels, the inference runner and result writer, the synthetic
benchmark set."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from ppdist.data.base import RejectedSample
from ppdist.data.image_size import DEFAULT_MAX_IMAGE_PIXELS, check_image_pixels
from ppdist.data.seg import CITYSCAPES_NAMES, read_class_names
from ppdist.data.synthetic_seg import generate_seg_dataset
from ppdist.tasks.registry import (
    BenchmarkData,
    BrowsePanel,
    GraphSpec,
    Task,
    eval_transform_size,
    register_task,
)
from ppdist.tasks.result_files import (
    file_stem,
    legend_strip,
    pseudo_colour_palette,
    stack_legend,
)
from ppdist.tasks.runner import (
    ImageReadError,
    Outputs,
    Result,
    Runner,
    Sample,
    build_postprocess_of,
    group_by,
)

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


class SegRunner(Runner):
    """Images -> ``{path, label_map [H, W]}`` at the original size (logits resized bilinearly)."""

    task = "seg"

    def __init__(self, info: Mapping[str, Any]) -> None:
        super().__init__(info)
        self.test_time = build_postprocess_of(info)  # SegPostProcess: scales, flips, sliding window

    def decode(self, raw: bytes, path: str) -> Sample:
        """RGB uint8 (H, W, 3), as ``SegDataSet.read`` gives it (its transforms start after decoding)."""
        try:
            check_image_pixels(raw, DEFAULT_MAX_IMAGE_PIXELS)
        except RejectedSample as exc:
            raise ImageReadError(path, str(exc)) from exc
        image = cv2.imdecode(np.frombuffer(raw, dtype=np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise ImageReadError(path, "cannot decode the image (not an image file?)")
        image = np.ascontiguousarray(image[:, :, ::-1])
        return {"img_path": path, "image": image, "ori_shape": image.shape[:2], "gt_fields": []}

    def finish(self, data: Sample) -> Sample:
        """CHW float32 (``SegDataSet.finish``)."""
        image = np.asarray(data["image"])
        image = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)
        return {
            "img_path": data["img_path"],
            "image": np.ascontiguousarray(image, dtype=np.float32),
            "ori_shape": tuple(int(v) for v in data["ori_shape"]),
        }

    def predict(
        self, run: Callable[[Dict[str, np.ndarray]], Outputs], samples: Sequence[Sample]
    ) -> List[Result]:
        """Plain pass, or the configured test-time augmentation / sliding window with ``run`` as
        the network (the same code as evaluation, ``SegPostProcess.infer``)."""
        if not (self.test_time.aug_eval or self.test_time.is_slide):
            return super().predict(run, samples)

        def network(image: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(np.asarray(run({"image": image.numpy()})["logits"], dtype=np.float32))

        results: List[Optional[Result]] = [None] * len(samples)
        for group in group_by([self.group_key(s) for s in samples]):
            chunk = [samples[i] for i in group]
            logits = self.test_time.infer(network, {"image": torch.from_numpy(self.batch(chunk)["image"])})
            for i, result in zip(group, self.postprocess({"logits": logits.numpy()}, chunk)):
                results[i] = result
        return results  # type: ignore[return-value]

    def postprocess(self, outputs: Outputs, samples: Sequence[Sample]) -> List[Result]:
        logits = torch.from_numpy(np.asarray(outputs["logits"], dtype=np.float32))
        results = []
        for i, sample in enumerate(samples):
            row = logits[i : i + 1]
            if tuple(row.shape[-2:]) != sample["ori_shape"]:
                row = F.interpolate(row, size=list(sample["ori_shape"]), mode="bilinear", align_corners=False)
            label_map = row[0].argmax(dim=0).numpy()
            dtype = np.uint8 if row.shape[1] <= 256 else np.int32
            results.append({"path": sample["img_path"], "label_map": label_map.astype(dtype)})
        return results


class SegWriter:
    """``output_dir/<stem>.png`` (palette mode, pixel value = class id) and ``<stem>_overlay.jpg``
    (the image blended with the class colours, PaddleSeg's weight 0.6, above a legend of the
    classes it shows: the data set's ``names`` when known, else ``class i``)."""

    def __init__(self, output_dir: str, weight: float = 0.6, names: Sequence[str] = ()) -> None:
        self.output_dir = output_dir
        self.weight = weight
        self.names = list(names)
        self.palette = pseudo_colour_palette(256)
        self.written: List[str] = []

    def add(self, results: Sequence[Result]) -> None:
        for r in results:
            self.written.extend(self.write(r))

    def write(self, result: Result) -> List[str]:
        label_map = result["label_map"]
        stem = os.path.join(self.output_dir, file_stem(result["path"]))
        if label_map.max(initial=0) < 256:
            png = Image.fromarray(label_map.astype(np.uint8))  # mode L; putpalette makes it P
            png.putpalette(self.palette)
        else:  # more classes than a palette holds: plain 16-bit class ids
            png = Image.fromarray(label_map.astype(np.uint16))
        png.save(stem + ".png")
        image = cv2.imread(result["path"], cv2.IMREAD_COLOR)
        colours = np.asarray(self.palette, dtype=np.uint8).reshape(-1, 3)[:, ::-1]  # BGR
        pseudo = colours[np.clip(label_map, 0, 255)]
        overlay = cv2.addWeighted(image, self.weight, pseudo, 1 - self.weight, 0)
        shown = [int(v) for v in np.unique(label_map) if 0 <= v < 256]
        legend = legend_strip(overlay.shape[1], shown, colours, self.names)
        cv2.imwrite(stem + "_overlay.jpg", stack_legend(overlay, legend) if shown else overlay)
        return [stem + ".png", stem + "_overlay.jpg"]

    def close(self) -> List[str]:
        return self.written

    def abort(self) -> None:
        """Nothing to drop: each image's files are complete once written."""


def seg_writer(output_dir: str, info: Mapping[str, Any], draw_threshold: float) -> "SegWriter":
    """Palette PNGs and overlays with a legend of the info's class names."""
    return SegWriter(output_dir, names=(info.get("labels") or {}).get("names") or ())


BENCHMARK_IMAGE_SIZE = (2048, 1024)  # [width, height]: Cityscapes'


def _benchmark_entry(data_dir: str, split: str, old: Mapping[str, Any]) -> Dict[str, Any]:
    """``SegDataSet`` file lists of ``generate_seg_dataset``."""
    keep = {k: old[k] for k in ("transforms", "batch_transforms") if k in old}
    key = "train_path" if split == "train" else "val_path"
    return dict(keep, name="SegDataSet", dataset_root=data_dir, **{key: f"{split}.txt"})


BENCHMARK_DATA = BenchmarkData(
    folder=lambda images: f"seg_{BENCHMARK_IMAGE_SIZE[0]}x{BENCHMARK_IMAGE_SIZE[1]}_{images}",
    generate=lambda data_dir, images: generate_seg_dataset(
        data_dir, images, images, image_size=list(BENCHMARK_IMAGE_SIZE)
    ),
    dataset_entry=_benchmark_entry,
)


def browse_targets(
    reader: Any, batch: Mapping[str, Any], sample: Any, draw: bool, raw: Optional[Mapping[str, Any]]
) -> None:
    """The label map's pixels per value (and the map itself for a picture)."""
    label = batch["label"][0].numpy().astype(np.int64)
    label = label.reshape(label.shape[-2:])
    values, counts = np.unique(label, return_counts=True)
    sample.pixel_counts = {int(v): int(n) for v, n in zip(values, counts)}
    if draw:
        sample.label_map = label


def browse_summary(browse: Any, counted: Sequence[Any]) -> Dict[str, Any]:
    """Labelled pixels in all and per class, the ignored ones apart."""
    pixels: Counter = Counter()
    for sample in counted:
        pixels.update(sample.pixel_counts)
    ignored = pixels.pop(browse.ignore_index, 0) if browse.ignore_index is not None else 0
    return {
        "labelled_pixels": sum(pixels.values()),
        "pixels_per_class": dict(sorted(pixels.items())),
        "ignored_pixels": ignored,
        "ignore_index": browse.ignore_index,
    }


BROWSE_PANEL = BrowsePanel(
    browse_targets, browse_summary, panel_px=(520, 280), columns=3, rows_per_page=4, class_legend=True
)


def training_sample(config: Mapping[str, Any], size: Tuple[int, int], index: int) -> Dict[str, torch.Tensor]:
    """An image and a random label map with an ignored (255) band at the top."""
    generator = torch.Generator().manual_seed(index)
    image = torch.randn(3, *size, generator=generator)
    label = torch.randint(0, config["Global"]["num_classes"], size, generator=generator)
    label[: size[0] // 8] = 255
    return {"image": image, "label": label}


TASK = register_task(
    Task(
        name="seg",
        postprocesses=("SegPostProcess",),
        inputs=INPUTS,
        outputs=OUTPUTS,
        runner=SegRunner,
        writer=seg_writer,
        benchmark_data=BENCHMARK_DATA,
        training_sample=training_sample,
        browse=BROWSE_PANEL,
        test_time_augmentation=True,
        build_deploy=build_seg_deploy,
        labels=segmentation_labels,
    )
)
