"""Text-recognition accuracy and normalised edit distance (PaddleOCR's ``RecMetric``)."""

from __future__ import annotations

import heapq
import math
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from rapidfuzz.distance import Levenshtein

from ppdist.metrics.base import Metric
from ppdist.registry import METRICS
from ppdist.utils.atomic import write_text_atomic
from ppdist.visualize.eval_pictures import character_confusion, mistakes_gallery
from ppdist.visualize.figures import display_image

EPS = 1e-5
GALLERY_SIZE = 16  # mistakes shown by ``pictures`` (only their images are kept)
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
        self.mistakes: List[Dict[str, Any]] = []  # label, pred, score, distance of every mistake
        self.gallery: List[Dict[str, Any]] = []  # the GALLERY_SIZE worst, with their images

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
        images = batch.get("image") if batch is not None else None
        new_mistakes = []
        for position, (pred, label) in enumerate(zip(preds, labels)):
            pred_text, label_text = self.normalize(_text(pred)), self.normalize(_text(label))
            distance = float(Levenshtein.normalized_distance(pred_text, label_text))
            self.edit_distances.append(distance)
            self.correct_num += int(pred_text == label_text)
            self.all_num += 1
            if pred_text != label_text:
                score = float(pred[1]) if not isinstance(pred, str) and len(pred) > 1 else 0.0
                new_mistakes.append(
                    (position, {"label": label_text, "pred": pred_text, "score": score, "distance": distance})
                )
        self.mistakes += [mistake for _, mistake in new_mistakes]
        candidates = self.gallery + [dict(m, position=p) for p, m in new_mistakes]
        self.gallery = heapq.nlargest(GALLERY_SIZE, candidates, key=_badness)
        for mistake in self.gallery:  # copy to the host only the images that make the gallery
            position = mistake.pop("position", None)
            if position is not None and images is not None:
                mistake["image"] = display_image(images[position], bgr=True)

    def state(self) -> Dict[str, Any]:
        return {
            "correct_num": self.correct_num,
            "all_num": self.all_num,
            "edit_distances": list(self.edit_distances),
            "mistakes": list(self.mistakes),
            "gallery": list(self.gallery),
        }

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        self.reset()
        for part in states:
            self.correct_num += int(part["correct_num"])
            self.all_num += int(part["all_num"])
            self.edit_distances.extend(float(d) for d in part["edit_distances"])
            self.mistakes.extend(part.get("mistakes", []))
            self.gallery.extend(part.get("gallery", []))
        self.gallery = heapq.nlargest(GALLERY_SIZE, self.gallery, key=_badness)

    def compute(self) -> Dict[str, float]:
        return {
            "acc": self.correct_num / (self.all_num + EPS),
            "norm_edit_dis": 1.0 - math.fsum(self.edit_distances) / (self.all_num + EPS),
        }

    def pictures(self, out_dir: str) -> List[str]:
        """``worst_mistakes.png`` (image, label, prediction, score) and ``character_confusion.md``."""
        os.makedirs(out_dir, exist_ok=True)
        written = []
        worst = [m for m in self.gallery if "image" in m]
        if worst:
            path = os.path.join(out_dir, "worst_mistakes.png")
            mistakes_gallery(worst, path)
            written.append(path)
        table = os.path.join(out_dir, "character_confusion.md")
        write_text_atomic(table, character_confusion([(m["label"], m["pred"]) for m in self.mistakes]))
        return written + [table]


def _badness(mistake: Mapping[str, Any]) -> Tuple[float, float]:
    return (float(mistake["distance"]), float(mistake["score"]))
