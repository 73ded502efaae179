"""Text-recognition accuracy and normalised edit distance (PaddleOCR's ``RecMetric``)."""

from __future__ import annotations

import heapq
import math
import re
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Union

from rapidfuzz.distance import Levenshtein

from ppdist.data.base import SAMPLE_INDEX_KEY
from ppdist.metrics.base import Metric
from ppdist.metrics.report import (
    MistakesGallery,
    ReportItem,
    TextFile,
    character_confusion,
    dataset_image,
    markdown_table,
    sample_origin,
)
from ppdist.registry import METRICS

EPS = 1e-5
GALLERY_SIZE = 16  # mistakes shown by ``report`` (their images read again from the dataset)
INDICATORS = ("acc", "norm_edit_dis")
_NOT_ALNUM = re.compile(r"[^0-9a-zA-Z]+")


def _text(item: Union[str, Sequence[Any]]) -> str:
    """The text of a ``(text, score)`` pair, or the string itself."""
    return item if isinstance(item, str) else item[0]


class Mistake(NamedTuple):
    """A wrong prediction: the sample's dataset index (-1: unknown), the compared texts, the
    prediction's score and their normalised edit distance."""

    index: int
    label: str
    pred: str
    score: float
    distance: float


@METRICS.register(name="RecMetric")
class RecMetric(Metric):
    """Exact-match accuracy and ``1 - mean normalised Levenshtein distance``.

    ``ignore_space`` removes spaces from both strings; ``is_filter`` keeps only [0-9A-Za-z]
    and lower-cases. The state is integer counts plus the per-sample distances, summed with
    ``math.fsum``, so merged states give exactly the unsplit numbers. ``compute`` does not reset.
    """

    def __init__(
        self, main_indicator: str = "acc", is_filter: bool = False, ignore_space: bool = True
    ) -> None:
        if main_indicator not in INDICATORS:
            raise ValueError(f"RecMetric.main_indicator must be one of {INDICATORS}, got {main_indicator!r}")
        self.main_indicator = main_indicator
        self.is_filter = is_filter
        self.ignore_space = ignore_space
        self.dataset: Any = None
        self.reset()

    def reset(self) -> None:
        self.correct_num = 0
        self.all_num = 0
        self.edit_distances: List[float] = []
        self.mistakes: List[Mistake] = []  # every wrong prediction (no image: see ``pictures``)

    def bind_dataset(self, dataset: Any) -> None:
        """The eval dataset (called by the evaluator): ``pictures`` re-reads the images of the
        worst mistakes from it by their ``_sample_index``."""
        self.dataset = dataset

    def normalize(self, text: str) -> str:
        if self.ignore_space:
            text = text.replace(" ", "")
        if self.is_filter:
            text = _NOT_ALNUM.sub("", text).lower()
        return text

    def update(self, results: Mapping[str, Any], batch: Optional[Mapping[str, Any]] = None) -> None:
        preds, labels = results["preds"], results["labels"]
        if len(preds) != len(labels):
            raise ValueError(f"RecMetric: {len(preds)} predictions for {len(labels)} labels")
        indices = batch.get(SAMPLE_INDEX_KEY) if batch is not None else None
        indices = [int(i) for i in indices] if indices is not None else [-1] * len(preds)
        for index, pred, label in zip(indices, preds, labels):
            pred_text, label_text = self.normalize(_text(pred)), self.normalize(_text(label))
            distance = float(Levenshtein.normalized_distance(pred_text, label_text))
            self.edit_distances.append(distance)
            self.correct_num += int(pred_text == label_text)
            self.all_num += 1
            if pred_text != label_text:
                score = float(pred[1]) if not isinstance(pred, str) and len(pred) > 1 else 0.0
                self.mistakes.append(Mistake(index, label_text, pred_text, score, distance))

    def state(self) -> Dict[str, Any]:
        return {
            "correct_num": self.correct_num,
            "all_num": self.all_num,
            "edit_distances": list(self.edit_distances),
            "mistakes": [tuple(m) for m in self.mistakes],
        }

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        self.reset()
        for part in states:
            self.correct_num += int(part["correct_num"])
            self.all_num += int(part["all_num"])
            self.edit_distances.extend(float(d) for d in part["edit_distances"])
            self.mistakes.extend(Mistake(*m) for m in part.get("mistakes", []))

    def worst_mistakes(self, count: int = GALLERY_SIZE) -> List[Mistake]:
        """The ``count`` worst mistakes: largest normalised edit distance (lowest per-sample
        ``norm_edit_dis``) first, then the most confident, then by dataset index."""
        return heapq.nsmallest(count, self.mistakes, key=lambda m: (-m.distance, -m.score, m.index))

    def compute(self) -> Dict[str, float]:
        return {
            "acc": self.correct_num / (self.all_num + EPS),
            "norm_edit_dis": 1.0 - math.fsum(self.edit_distances) / (self.all_num + EPS),
        }

    def report(self) -> List[ReportItem]:
        """``worst_mistakes.png`` (image, label, prediction, score of the ``GALLERY_SIZE`` worst
        mistakes, their images read again from the bound dataset) and ``worst_mistakes.md`` (the
        same with each sample's origin), when there is a mistake; ``character_confusion.md``."""
        items: List[ReportItem] = []
        worst = [
            dict(
                m._asdict(),
                image=dataset_image(self.dataset, m.index),
                origin=sample_origin(self.dataset, m.index),
            )
            for m in self.worst_mistakes()
        ]
        if worst:
            header = ["#", "label", "prediction", "score", "normalised edit distance", "sample"]
            rows = [
                (
                    n + 1,
                    _code(m["label"]),
                    _code(m["pred"]),
                    f"{m['score']:.4f}",
                    f"{m['distance']:.4f}",
                    m["origin"],
                )
                for n, m in enumerate(worst)
            ]
            title = f"The {len(worst)} worst of {len(self.mistakes)} mistake(s) in {self.all_num} sample(s)"
            items += [
                MistakesGallery("worst_mistakes.png", worst),
                TextFile("worst_mistakes.md", markdown_table(header, rows, title)),
            ]
        confusions = character_confusion([(m.label, m.pred) for m in self.mistakes])
        return items + [TextFile("character_confusion.md", confusions)]


def _code(text: str) -> str:
    """``text`` as inline code in a markdown table cell (``(empty)`` for no text)."""
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`" if text else "(empty)"
