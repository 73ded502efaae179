"""Text-recognition accuracy and normalised edit distance (PaddleOCR's ``RecMetric``)."""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from rapidfuzz.distance import Levenshtein

from ppdist.metrics.base import Metric
from ppdist.registry import METRICS

EPS = 1e-5
INDICATORS = ("acc", "norm_edit_dis")
_NOT_ALNUM = re.compile(r"[^0-9a-zA-Z]+")


def _text(item: Union[str, Sequence[Any]]) -> str:
    """The text of a ``(text, score)`` pair, or the string itself."""
    return item if isinstance(item, str) else item[0]


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
        self.reset()

    def reset(self) -> None:
        self.correct_num = 0
        self.all_num = 0
        self.edit_distances: List[float] = []

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
        for pred, label in zip(preds, labels):
            pred_text, label_text = self.normalize(_text(pred)), self.normalize(_text(label))
            self.edit_distances.append(float(Levenshtein.normalized_distance(pred_text, label_text)))
            self.correct_num += int(pred_text == label_text)
            self.all_num += 1

    def state(self) -> Dict[str, Any]:
        return {
            "correct_num": self.correct_num,
            "all_num": self.all_num,
            "edit_distances": list(self.edit_distances),
        }

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        self.reset()
        for part in states:
            self.correct_num += int(part["correct_num"])
            self.all_num += int(part["all_num"])
            self.edit_distances.extend(float(d) for d in part["edit_distances"])

    def compute(self) -> Dict[str, float]:
        return {
            "acc": self.correct_num / (self.all_num + EPS),
            "norm_edit_dis": 1.0 - math.fsum(self.edit_distances) / (self.all_num + EPS),
        }
