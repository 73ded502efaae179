"""Greedy CTC decoding into ``(text, score)`` pairs (PaddleOCR's ``CTCLabelDecode``)."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ppdist.data.charset import load_characters
from ppdist.registry import POSTPROCESSES

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[Any]]

BLANK = "blank"
# Runs of these characters keep their order when a right-to-left prediction is reversed.
_LTR_RUN = re.compile(r"[a-zA-Z0-9 :*./%+-]+|.", re.DOTALL)


def to_numpy(value: ArrayLike) -> np.ndarray:
    """A numpy array from a tensor (any device or dtype; floats become float32) or array."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.is_floating_point():
            value = value.float()
        return value.cpu().numpy()
    return np.asarray(value)


def best_path(preds: ArrayLike) -> Tuple[np.ndarray, np.ndarray]:
    """Per frame, the first most probable class and its probability, (B, T) each. A tensor is
    reduced where it lives and only the two (B, T) results cross to the host, in one transfer."""
    if not isinstance(preds, torch.Tensor):
        probs = to_numpy(preds)
        return probs.argmax(axis=2), probs.max(axis=2)
    probs = preds.detach().float()
    indices = probs.argmax(dim=2)  # the first maximum, as numpy's argmax
    both = torch.stack([indices.to(torch.float64), probs.amax(dim=2).to(torch.float64)]).cpu().numpy()
    return both[0].astype(np.int64), both[1].astype(np.float32)


def label_of(batch: Optional[Mapping[str, Any]], keys: Sequence[str]) -> Any:
    """The first of ``keys`` that ``batch`` holds (None without a batch or any of them)."""
    for key in keys if batch is not None else ():
        if key in batch:
            return batch[key]
    return None


def reverse_rtl(text: str) -> str:
    """Reverse a right-to-left text, keeping runs of Latin letters, digits and ' :*./%+-'."""
    return "".join(reversed(_LTR_RUN.findall(text)))


@POSTPROCESSES.register(name="CTCLabelDecode")
class CTCLabelDecode:
    """Greedy decode: argmax per frame, collapse repeats, drop the blank (index 0).

    The score of a text is the mean of the kept frames' max probabilities (0.0 when nothing
    is kept). Labels in ``batch["label"]`` (``batch["label_ctc"]`` when there is none: the
    multi-head recipes' batches) are decoded without collapsing, dropping index 0. A multi-head
    training output (a mapping) is decoded from its ``ctc`` branch.
    """

    def __init__(self, character_dict_path: Optional[str] = None, use_space_char: bool = False) -> None:
        self.character: List[str] = [BLANK] + load_characters(character_dict_path, use_space_char)
        self.num_classes = len(self.character)
        self.reverse = bool(character_dict_path) and "arabic" in character_dict_path

    def __call__(
        self, preds: Union[ArrayLike, Sequence[ArrayLike]], batch: Optional[Mapping[str, Any]] = None
    ) -> Dict[str, Any]:
        if isinstance(preds, Mapping):
            if "ctc" not in preds:
                raise ValueError(
                    f"{type(self).__name__}: the predictions hold no 'ctc' branch ({sorted(preds)})"
                )
            preds = preds["ctc"]
        if isinstance(preds, (list, tuple)):
            preds = preds[-1]
        shape = tuple(preds.shape) if hasattr(preds, "shape") else np.shape(preds)
        if len(shape) != 3 or shape[2] != self.num_classes:
            raise ValueError(
                f"CTCLabelDecode expects predictions (B, T, {self.num_classes}), got shape {shape}"
            )
        results: Dict[str, Any] = {"preds": self.decode_best_path(*best_path(preds))}
        labels = label_of(batch, ("label", "label_ctc"))
        if labels is not None:
            results["labels"] = self.decode_labels(to_numpy(labels))
        return results

    def decode_predictions(self, probs: np.ndarray) -> List[Tuple[str, float]]:
        """``(text, score)`` for each row of ``probs`` (B, T, C)."""
        return self.decode_best_path(probs.argmax(axis=2), probs.max(axis=2))

    def decode_best_path(self, indices: np.ndarray, max_probs: np.ndarray) -> List[Tuple[str, float]]:
        """``(text, score)`` for each row of the per-frame best classes and their probabilities (B, T)."""
        keep = indices != 0
        keep[:, 1:] &= indices[:, 1:] != indices[:, :-1]
        decoded = []
        for row_indices, row_probs, row_keep in zip(indices, max_probs, keep):
            kept = row_probs[row_keep]
            score = float(np.mean(kept, dtype=np.float64)) if kept.size else 0.0
            decoded.append((self._to_text(row_indices[row_keep]), score))
        return decoded

    def decode_labels(self, labels: np.ndarray) -> List[str]:
        """Text of each zero-padded label row (B, L); index 0 is dropped, repeats are kept."""
        labels = np.asarray(labels).reshape(len(labels), -1)
        return [self._to_text(row[row != 0]) for row in labels]

    def _to_text(self, indices: np.ndarray) -> str:
        text = "".join(self.character[int(i)] for i in indices)
        return reverse_rtl(text) if self.reverse else text
