"""What the model sees: samples of a config's split after its transforms (and batch transforms),
drawn with their targets, and a summary of the split (``tools/browse_dataset.py``).

Detection: the image with its boxes and class names; segmentation: the label map over the image in
a palette (``ignore_index`` white); recognition: the text line with its label decoded back with
the dictionary. Images are shown as the network gets them, rescaled to 0..255 for display (the
normalisation is undone by the image's own range, colours in RGB order).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ppdist.components import build_postprocess
from ppdist.data.base import BAD_SAMPLES_KEY, NOTES_KEY, BadSample
from ppdist.data.build import build_dataset, build_transforms, collate
from ppdist.visualize.figures import display_image, new_figure, save_png

PANEL_PX = {"det": (320, 320), "seg": (320, 320), "rec": (400, 140)}
COLUMNS = {"det": 4, "seg": 4, "rec": 3}


@dataclass
class BrowsedSample:
    """One sample as the model gets it: an RGB uint8 image for display and its target."""

    index: int
    origin: str
    image: np.ndarray
    boxes: Optional[np.ndarray] = None  # det: (N, 4) xyxy in the image's pixels
    classes: Optional[np.ndarray] = None  # det: (N,) class indices
    label_map: Optional[np.ndarray] = None  # seg: (H, W)
    text: Optional[str] = None  # rec


@dataclass
class Browse:
    """The samples read and what the split's summary counts."""

    task: str
    split: str
    samples: List[BrowsedSample] = field(default_factory=list)
    bad: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    class_names: List[str] = field(default_factory=list)


def _decodes_bgr(transforms: Sequence[Any]) -> bool:
    for entry in transforms or []:
        if isinstance(entry, Mapping) and "DecodeImage" in entry:
            return str((entry["DecodeImage"] or {}).get("img_mode", "RGB")).upper() == "BGR"
    return False


def split_dataset(config: Mapping[str, Any], split: str) -> Any:
    """The dataset of ``config[split]`` (``Train`` in training mode: its augmentation)."""
    return build_dataset(config, split, "train" if split == "Train" else "eval")


def read_samples(config: Mapping[str, Any], split: str, dataset: Any, indices: Sequence[int]) -> Browse:
    """Samples ``indices`` of ``dataset`` (``config[split]``'s) through its transforms and the
    batch transforms (one sample per batch), with the bad samples it replaced or refused."""
    task = config["Architecture"]["model_type"]
    section = config[split]["dataset"]
    batch_ops = build_transforms(section.get("batch_transforms"), config, f"{split}.dataset.batch_transforms")
    bgr = _decodes_bgr(section.get("transforms"))
    characters = build_postprocess(config).character if task == "rec" else None
    browse = Browse(task, split, class_names=list(getattr(dataset, "label_list", []) or []))
    seed = int(config["Global"]["seed"])
    for index in indices:
        item = dataset[(int(index), 1, seed)]  # epoch 1's augmentation
        if isinstance(item, BadSample):
            browse.bad.append(str(item))
            continue
        batch = collate([item], batch_ops)
        browse.bad += batch.pop(BAD_SAMPLES_KEY, [])
        browse.notes += batch.pop(NOTES_KEY, [])
        if not batch:
            continue
        sample = BrowsedSample(int(index), dataset.origin(int(index)), display_image(batch["image"][0], bgr))
        if task == "det" and "gt_bbox" not in batch:  # an eval pipeline that keeps no boxes
            sample.boxes, sample.classes = np.zeros((0, 4), np.float32), np.zeros(0, int)
        elif task == "det":
            boxes = batch["gt_bbox"][0].reshape(-1, 4).numpy()
            classes = batch["gt_class"][0].reshape(-1).numpy().astype(int)
            real = (
                batch["pad_gt_mask"][0].reshape(-1).numpy() > 0
                if "pad_gt_mask" in batch
                else np.ones(len(boxes), bool)
            )
            sample.boxes, sample.classes = boxes[real], classes[real]
        elif task == "seg":
            sample.label_map = batch["label"][0].reshape(sample.image.shape[:2]).numpy().astype(np.int64)
        elif task == "rec":
            length = int(batch["length"][0])
            sample.text = "".join(characters[int(i)] for i in batch["label"][0][:length])
        browse.samples.append(sample)
    return browse


def palette(count: int) -> np.ndarray:
    """``count`` distinct RGB colours (PaddleSeg-style bit-reversed palette), uint8."""
    colours = np.zeros((count, 3), np.uint8)
    for label in range(count):
        value, shift = label, 7
        while value:
            for channel in range(3):
                colours[label, channel] |= ((value >> channel) & 1) << shift
            value >>= 3
            shift -= 1
    return colours


def draw_samples(browse: Browse, out_path: str, ignore_index: int = 255) -> None:
    """A grid of the browsed samples with their targets, written to ``out_path`` (PNG)."""
    if not browse.samples:
        raise ValueError(f"{browse.split}: no usable sample to draw ({len(browse.bad)} bad)")
    columns = min(COLUMNS[browse.task], len(browse.samples))
    rows = math.ceil(len(browse.samples) / columns)
    width, height = PANEL_PX[browse.task]
    figure = new_figure((width * columns, height * rows))
    for position, sample in enumerate(browse.samples):
        axes = figure.add_subplot(rows, columns, position + 1)
        axes.set_axis_off()
        image = sample.image
        if sample.label_map is not None:
            colours = palette(int(max(sample.label_map.max(), 0)) + 1)
            overlay = colours[np.clip(sample.label_map, 0, len(colours) - 1)]
            overlay[sample.label_map == ignore_index] = 255
            image = (0.5 * image + 0.5 * overlay).astype(np.uint8)
        axes.imshow(image)
        title = f"#{sample.index}"
        if sample.boxes is not None:
            for box, cls in zip(sample.boxes, sample.classes):
                colour = tuple(palette(int(cls) + 2)[int(cls) + 1] / 255.0)
                x1, y1, x2, y2 = (float(v) for v in box)
                axes.add_patch(_rectangle(x1, y1, x2 - x1, y2 - y1, colour))
                name = browse.class_names[cls] if 0 <= cls < len(browse.class_names) else str(cls)
                axes.text(x1, y1, name, color="white", fontsize=7, va="bottom", backgroundcolor=colour)
            title += f": {len(sample.boxes)} box(es)"
        if sample.text is not None:
            title += f": {sample.text!r}"
        axes.set_title(title, fontsize=8)
    figure.tight_layout()
    save_png(figure, out_path)


def _rectangle(x: float, y: float, width: float, height: float, colour: tuple) -> Any:
    from matplotlib.patches import Rectangle  # noqa: PLC0415  (matplotlib's patches: drawing only)

    return Rectangle((x, y), width, height, fill=False, edgecolor=colour, linewidth=1.5)


def summarize(browse: Browse) -> Dict[str, Any]:
    """Image sizes, class histogram (det boxes, seg pixels, rec characters), boxes per image,
    label lengths and the bad samples of the browsed samples."""
    sizes = Counter(f"{s.image.shape[1]}x{s.image.shape[0]}" for s in browse.samples)
    summary: Dict[str, Any] = {
        "split": browse.split,
        "task": browse.task,
        "samples": len(browse.samples),
        "image_sizes_after_transforms": dict(sizes.most_common()),
        "bad_samples": list(browse.bad),
        "changed_samples": list(browse.notes),
    }
    if browse.task == "det":
        names = browse.class_names
        counts = Counter(int(c) for s in browse.samples for c in s.classes)
        summary["boxes_per_class"] = {
            (names[c] if c < len(names) else str(c)): n for c, n in sorted(counts.items())
        }
        summary["boxes_per_image"] = dict(sorted(Counter(len(s.boxes) for s in browse.samples).items()))
    elif browse.task == "seg":
        values, totals = np.unique(
            np.concatenate([s.label_map.ravel() for s in browse.samples]), return_counts=True
        )
        summary["pixels_per_class"] = {int(v): int(n) for v, n in zip(values, totals)}
    elif browse.task == "rec":
        summary["characters"] = dict(Counter("".join(s.text for s in browse.samples)).most_common())
        summary["label_lengths"] = dict(sorted(Counter(len(s.text) for s in browse.samples).items()))
    return summary


def choose_indices(length: int, num: int, shuffle: bool, seed: int) -> List[int]:
    """``num`` sample indices of a split of ``length``: the first ones, or a seeded random choice."""
    if shuffle:
        return sorted(random.Random(seed).sample(range(length), min(num, length)))
    return list(range(min(num, length)))
