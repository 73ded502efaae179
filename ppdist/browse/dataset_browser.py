"""What the model sees: samples of a config's split after its transforms and batch transforms
(``ppdist.data.build``'s dataset and collate, one sample per batch, one process), with their
targets, and what they hold (``tools/browse_dataset.py``).

A sample keeps its display image (the normalisation undone, see ``denormalize``) only when it is
to be drawn; the counting pass over a whole split (``--all``) keeps the targets' numbers only.
In training mode a dataset replaces a bad sample by the next usable one (so the model sees that
one); such a replacement is drawn but counted once only, at its own index. A detection eval
pipeline keeps no boxes (the metric reads the annotations): its annotated boxes are shown scaled
by the sample's ``scale_factor``. A table sample shows its learned cell boxes and its structure
(``ppdist.tasks.table_browse``); every table read, bad ones too, has its structure length
counted (the encoder rejects those above ``max_text_length``).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ppdist.components import build_postprocess
from ppdist.data.base import BAD_SAMPLES_KEY, NOTES_KEY, BadSample
from ppdist.data.build import build_dataset, build_transforms, collate
from ppdist.data.image_size import header_size
from ppdist.data.transforms.table import TableLabelEncode
from ppdist.tasks import BrowsePanel, get_task, table_browse, task_of
from ppdist.visualize.denormalize import Normalization, find_normalization, to_display

Size = Tuple[int, int]  # (width, height)


@dataclass
class BrowsedSample:
    """One sample as the model gets it: its size, target and (when drawn) its display image."""

    index: int
    origin: str
    size: Size  # after the transforms
    raw_size: Optional[Size] = None  # of the image file / decoded image before any transform
    image: Optional[np.ndarray] = None  # (H, W, 3) uint8 RGB, only for samples to draw
    boxes: Optional[np.ndarray] = None  # det: (N, 4) xyxy in the transformed image's pixels
    classes: Optional[np.ndarray] = None  # det: (N,) class indices
    label_map: Optional[np.ndarray] = None  # seg: (H, W), only for samples to draw
    pixel_counts: Optional[Dict[int, int]] = None  # seg: label value -> pixels
    text: Optional[str] = None  # rec: the label decoded back with the dictionary
    structure: Optional[List[str]] = None  # table: the encoded structure tokens
    grid: Optional[table_browse.TableGrid] = None  # table: rows, columns, cells, spanning cells
    replaces: Optional[str] = None  # the bad sample (train mode) this one stands in for


@dataclass
class Browse:
    """The samples read, the bad samples met and the split's facts the summary needs."""

    task: str
    split: str
    dataset_length: int
    samples: List[BrowsedSample] = field(default_factory=list)
    bad: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    class_names: List[str] = field(default_factory=list)
    ignore_index: Optional[int] = None
    structure_lengths: List[int] = field(default_factory=list)  # table: of every sample read
    max_text_length: Optional[int] = None  # table: the encoder's


@dataclass
class _Reader:
    config: Mapping[str, Any]
    split: str
    dataset: Any
    panel: BrowsePanel
    batch_ops: List[Any]
    normalization: Optional[Normalization]
    characters: Optional[List[str]]
    table_encoder: Optional[TableLabelEncode] = None
    box_format: str = "xyxy"


def split_dataset(config: Mapping[str, Any], split: str) -> Any:
    """The dataset of ``config[split]`` (``Train`` in training mode: its augmentation)."""
    return build_dataset(config, split, "train" if split == "Train" else "eval")


def _reader(config: Mapping[str, Any], split: str, dataset: Any) -> _Reader:
    section = config[split]["dataset"]
    where = f"{split}.dataset.batch_transforms"
    batch_ops = build_transforms(section.get("batch_transforms"), config, where)
    panel = get_task(config).browse
    characters = list(build_postprocess(config).character) if panel.needs_characters else None
    ops = list(getattr(dataset, "ops", []))
    normalization = find_normalization(ops + batch_ops)
    encoder = table_browse.find_op(ops, TableLabelEncode)
    box_format = table_browse.out_box_format(ops)
    return _Reader(config, split, dataset, panel, batch_ops, normalization, characters, encoder, box_format)


def read_raw(dataset: Any, index: int) -> Optional[Dict[str, Any]]:
    """Sample ``index`` as the dataset reads it, before any transform; None when it cannot be
    read (a bad sample: the transform pass reports it)."""
    try:
        return dataset.read(index)
    except Exception:
        return None


def raw_size(raw: Optional[Mapping[str, Any]]) -> Optional[Size]:
    """(width, height) of a raw sample's image as stored (file header, or the decoded array a
    dataset reads), or None when unknown."""
    image = raw.get("image") if raw is not None else None
    if isinstance(image, np.ndarray) and image.ndim >= 2:
        return int(image.shape[1]), int(image.shape[0])
    if isinstance(image, (bytes, bytearray, memoryview, str)):
        return header_size(image)
    return None


def _image_size(image: Any) -> Size:
    shape = tuple(np.shape(image))
    if len(shape) == 3 and shape[0] in (1, 3) and shape[-1] not in (1, 3):
        return int(shape[2]), int(shape[1])
    return int(shape[1]), int(shape[0])


def _read(reader: _Reader, index: int, draw: bool, browse: Browse) -> None:
    seed = int(reader.config["Global"]["seed"])
    item = reader.dataset[(int(index), 1, seed)]  # epoch 1's augmentation
    if reader.panel.on_read is not None:  # every sample read, a rejected one too
        reader.panel.on_read(reader, read_raw(reader.dataset, int(index)), browse)
    if isinstance(item, BadSample):
        browse.bad.append(str(item))
        return
    batch = collate([item], reader.batch_ops)
    replaced = batch.pop(BAD_SAMPLES_KEY, [])
    browse.bad += replaced
    browse.notes += batch.pop(NOTES_KEY, [])
    if not batch:
        return
    image = batch["image"][0]
    sample = BrowsedSample(int(index), reader.dataset.origin(int(index)), _image_size(image))
    sample.replaces = replaced[0] if replaced else None
    raw = read_raw(reader.dataset, int(index)) if sample.replaces is None else None
    sample.raw_size = raw_size(raw)
    if draw:
        sample.image = to_display(image, reader.normalization, bgr=False)
    reader.panel.targets(reader, batch, sample, draw, raw)
    browse.samples.append(sample)


def read_samples(
    config: Mapping[str, Any], split: str, dataset: Any, indices: Sequence[int], draw: bool = True
) -> Browse:
    """Samples ``indices`` of ``dataset`` (``config[split]``'s) through its transforms and batch
    transforms, with the bad samples it replaced or refused; ``draw`` keeps display images."""
    task = task_of(config)
    browse = Browse(
        task,
        split,
        len(dataset),
        class_names=list(getattr(dataset, "label_list", []) or []),
        ignore_index=getattr(dataset, "ignore_index", None),
    )
    reader = _reader(config, split, dataset)
    if reader.table_encoder is not None:
        browse.max_text_length = reader.table_encoder.max_text_length
    for index in indices:
        _read(reader, int(index), draw, browse)
    return browse


def choose_indices(length: int, num: int, shuffle: bool, seed: int) -> List[int]:
    """``num`` sample indices of a split of ``length``: the first ones, or a seeded random choice."""
    if shuffle:
        return sorted(random.Random(seed).sample(range(length), min(num, length)))
    return list(range(min(num, length)))


def _sizes(sizes: Sequence[Size], top: int = 10) -> Dict[str, Any]:
    counts = Counter(f"{w}x{h}" for w, h in sizes)
    out: Dict[str, Any] = dict(counts.most_common(top))
    if len(counts) > top:
        out["other"] = sum(n for _, n in counts.most_common()[top:])
    if sizes:
        widths, heights = [w for w, _ in sizes], [h for _, h in sizes]
        out["width_range"] = [min(widths), max(widths)]
        out["height_range"] = [min(heights), max(heights)]
    return out


def summarize(browse: Browse) -> Dict[str, Any]:
    """Image sizes (after the transforms and as stored), class histogram (det boxes, seg pixels,
    rec characters), boxes per image, label lengths, table rows / columns / cells / spans /
    structure lengths (``table_browse.table_summary``) and the bad samples, of the browsed samples
    (a replacement of a bad sample is not counted: it is counted at its own index)."""
    counted = [s for s in browse.samples if s.replaces is None]
    summary: Dict[str, Any] = {
        "split": browse.split,
        "task": browse.task,
        "dataset_samples": browse.dataset_length,
        "samples_counted": len(counted),
        "image_sizes_after_transforms": _sizes([s.size for s in counted]),
        "raw_image_sizes": _sizes([s.raw_size for s in counted if s.raw_size is not None]),
    }
    summary.update(get_task(browse.task).browse.summary(browse, counted))
    summary["bad_samples"] = list(browse.bad)
    summary["changed_samples"] = list(browse.notes)
    return summary


def _table(values: Mapping[Any, Any], width: int = 16) -> List[str]:
    items = list(values.items())
    lines: List[str] = []
    for start in range(0, len(items), width):
        chunk = items[start : start + width]
        lines += [
            "| " + " | ".join(f"`{k}`" for k, _ in chunk) + " |",
            "|" + "---|" * len(chunk),
            "| " + " | ".join(str(v) for _, v in chunk) + " |",
            "",
        ]
    return lines


def summary_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as a short markdown document: its numbers, then one table per histogram and
    the lists (bad samples, pictures)."""
    lines = [f"# {summary['split']} split ({summary['task']}): {summary.get('of', '')}", ""]
    tables: List[str] = []
    for key, value in summary.items():
        title = key.replace("_", " ")
        if key in ("split", "task", "of"):
            continue
        if isinstance(value, Mapping):
            tables += [f"## {title}", ""] + (_table(value) if value else ["(none)", ""])
        elif isinstance(value, list) and key in ("bad_samples", "changed_samples", "pictures"):
            tables += [f"## {title} ({len(value)})", ""] + [f"- {v}" for v in value] + [""]
        else:
            lines.append(f"- {title}: {value}")
    return "\n".join(lines + [""] + tables).rstrip() + "\n"
