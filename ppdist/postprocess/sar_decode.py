"""SAR decoding into ``(text, score)`` pairs (PaddleOCR's ``SARLabelDecode``)."""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ppdist.data.charset import load_characters
from ppdist.postprocess.ctc_decode import ArrayLike, best_path, label_of, to_numpy
from ppdist.registry import POSTPROCESSES

UNKNOWN, START_END, PADDING = "<UKN>", "<BOS/EOS>", "<PAD>"
# what rm_symbol removes: all but ASCII letters, digits, CJK ideographs (and '^', as Paddle's class)
_SYMBOLS = re.compile("[^A-Z^a-z^0-9^\u4e00-\u9fa5]")


@POSTPROCESSES.register(name="SARLabelDecode")
class SARLabelDecode:
    """Argmax per step, read until the end token, padding skipped, repeats kept.

    Classes: the dictionary's characters [+ space], then <UKN>, <BOS/EOS> (start and end share
    it) and <PAD>: with n CTC classes, n + 2 in all, the end token is n and the padding n + 1.
    The score is the mean probability of the kept steps (nan when none is kept, as in Paddle).
    Labels (``batch["label_sar"]``, else ``batch["label"]``) skip the leading start token.
    ``rm_symbol`` lower-cases and keeps letters, digits and CJK ideographs only. A multi-head
    output (a mapping) is decoded from its ``sar`` branch.
    """

    def __init__(
        self, character_dict_path: Optional[str] = None, use_space_char: bool = False, rm_symbol: bool = False
    ) -> None:
        self.character: List[str] = load_characters(character_dict_path, use_space_char) + [
            UNKNOWN,
            START_END,
            PADDING,
        ]
        self.end_idx = len(self.character) - 2
        self.padding_idx = len(self.character) - 1
        self.num_classes = len(self.character)
        self.rm_symbol = rm_symbol

    def __call__(self, preds: Any, batch: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        if isinstance(preds, Mapping):
            preds = preds["sar"]
        shape = tuple(preds.shape) if hasattr(preds, "shape") else np.shape(preds)
        if len(shape) != 3 or shape[2] != self.num_classes:
            raise ValueError(
                f"SARLabelDecode expects predictions (B, L, {self.num_classes}), got shape {shape}"
            )
        indices, probs = best_path(preds)
        results: Dict[str, Any] = {"preds": [self._decode_row(i, p) for i, p in zip(indices, probs)]}
        labels = label_of(batch, ("label_sar", "label"))
        if labels is not None:
            results["labels"] = self.decode_labels(to_numpy(labels))
        return results

    def decode_labels(self, labels: ArrayLike) -> List[str]:
        """Text of each SAR-encoded label row: the start token skipped, read until the end token."""
        return [self._decode_row(row, None)[0] for row in np.asarray(labels).reshape(len(labels), -1)]

    def _decode_row(self, indices: np.ndarray, probs: Optional[np.ndarray]) -> Tuple[str, float]:
        chars, scores = [], []
        for step, index in enumerate(int(i) for i in indices):
            if index == self.padding_idx:
                continue
            if index == self.end_idx:
                if probs is None and step == 0:  # a label's start token
                    continue
                break
            chars.append(self.character[index])
            scores.append(float(probs[step]) if probs is not None else 1.0)
        text = "".join(chars)
        if self.rm_symbol:
            text = _SYMBOLS.sub("", text.lower())
        return text, (math.fsum(scores) / len(scores) if scores else math.nan)
