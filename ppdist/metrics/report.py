"""What a metric reports after an evaluation, as data: the text files it writes and the pictures
``ppdist.visualize.eval_pictures.write_report`` draws from its numbers (PR curves, confusion
matrices, galleries of the worst samples). Metrics import nothing that draws."""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image
from rapidfuzz.distance import Levenshtein

from ppdist.utils.display import display_image


@dataclass
class TextFile:
    """A text file of the report (markdown tables, listings): ``file`` in the report's folder."""

    file: str
    text: str


@dataclass
class PRCurves:
    """Precision against recall from COCOeval's ``precision [T, R, K, A, M]``, per class and over all."""

    file: str
    precision: np.ndarray
    recall_thresholds: np.ndarray
    class_names: Sequence[str]


@dataclass
class ConfusionMatrix:
    """Counts, rows the truth, columns the prediction; cells labelled with their row share
    (``normalize_rows``) or their count."""

    file: str
    matrix: np.ndarray
    names: Sequence[str]
    title: str
    normalize_rows: bool = False


@dataclass
class ClassBars:
    """One bar per class (segmentation IoU)."""

    file: str
    values: Sequence[float]
    names: Sequence[str]
    title: str


@dataclass
class MistakesGallery:
    """Recognition mistakes in order: ``{"image": HxWx3 uint8 or None, "label", "pred", "score",
    "distance"}`` each."""

    file: str
    mistakes: List[Dict[str, Any]] = field(default_factory=list)


@dataclass
class TablesGallery:
    """Tables in order: ``{"image": HxWx3 uint8 or None, "pred_boxes", "label_boxes", "title"}`` each."""

    file: str
    items: List[Dict[str, Any]] = field(default_factory=list)


@dataclass
class AccuracyByLength:
    """Structure accuracy (and mean TEDS) per bin of labelled length: ``TableMetric``'s rows."""

    file: str
    rows: List[Mapping[str, Any]] = field(default_factory=list)


ReportItem = Union[
    TextFile, PRCurves, ConfusionMatrix, ClassBars, MistakesGallery, TablesGallery, AccuracyByLength
]


def dataset_image(dataset: Any, index: int) -> Optional[np.ndarray]:
    """Sample ``index`` of ``dataset`` as stored (its ``read(index)["image"]``: encoded bytes or
    an array) as HxWx3 uint8 RGB; None when there is no dataset, no index or it cannot be read."""
    if dataset is None or index < 0 or not hasattr(dataset, "read"):
        return None
    try:
        image = dataset.read(index)["image"]
        if isinstance(image, (bytes, bytearray, memoryview)):
            with Image.open(io.BytesIO(bytes(image))) as decoded:
                return np.asarray(decoded.convert("RGB"))
        return display_image(image, bgr=False)
    except Exception:  # a picture of the mistakes never fails the evaluation
        return None


def sample_origin(dataset: Any, index: int) -> str:
    """Where sample ``index`` comes from (the dataset's ``origin``, e.g. ``val.txt:12 (img.png)``)."""
    if dataset is None or index < 0:
        return "?" if index < 0 else f"sample {index}"
    origin = getattr(dataset, "origin", None)
    return str(origin(index)) if origin is not None else f"sample {index}"


def character_confusion(pairs: Sequence[Tuple[str, str]], top: int = 20) -> str:
    """Markdown: the most frequent character substitutions, deletions and insertions that turn
    each label into its (wrong) prediction (Levenshtein edit operations)."""
    replaced: Counter = Counter()
    deleted: Counter = Counter()
    inserted: Counter = Counter()
    for label, pred in pairs:
        for op in Levenshtein.editops(label, pred):
            if op.tag == "replace":
                replaced[(label[op.src_pos], pred[op.dest_pos])] += 1
            elif op.tag == "delete":
                deleted[label[op.src_pos]] += 1
            else:
                inserted[pred[op.dest_pos]] += 1
    lines = [f"# Character confusions of {len(pairs)} wrong prediction(s)", ""]
    lines += ["| label char | predicted | count |", "|---|---|---|"]
    lines += [f"| {_char(a)} | {_char(b)} | {n} |" for (a, b), n in replaced.most_common(top)]
    lines += ["", "| missed (deleted) | count |", "|---|---|"] + [
        f"| {_char(c)} | {n} |" for c, n in deleted.most_common(top)
    ]
    lines += ["", "| extra (inserted) | count |", "|---|---|"] + [
        f"| {_char(c)} | {n} |" for c, n in inserted.most_common(top)
    ]
    return "\n".join(lines) + "\n"


def _char(char: str) -> str:
    """One character as a markdown table cell (a space, ``|`` and a backtick stay readable)."""
    return {" ": "(space)", "|": "`\\|`", "`": "(backtick)"}.get(char, f"`{char}`")


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[object]], title: Optional[str] = None
) -> str:
    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
