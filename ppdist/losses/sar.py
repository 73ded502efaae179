"""SAR's cross entropy (PaddleOCR's ``SARLoss``): the prediction of step t scores the label's token
t + 1 (the start token is never a target), padding ignored, mean over the scored tokens."""

from __future__ import annotations

from typing import Any, Dict, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.losses.precision import full_precision
from ppdist.registry import LOSSES

PADDLE_DEFAULT_IGNORE_INDEX = 92  # PaddleOCR's default; tools/train.py sets n + 1 for the PP-OCRv3 recipes


def sar_padding_index(num_ctc_classes: int) -> int:
    """The SAR padding index of a dictionary whose CTC decoder has ``num_ctc_classes`` (n) classes:
    SAR's tokens are the n - 1 characters, <UKN>, <BOS/EOS>, <PAD>, so <PAD> is n + 1."""
    return num_ctc_classes + 1


@LOSSES.register(name="SARLoss")
class SARLoss(nn.Module):
    """``forward(preds, batch) -> {"loss": scalar}``.

    ``preds``: logits (B, L, C); ``batch["label"]`` (B, L): ``[start, text..., end, padding...]``
    as SARLabelEncode writes it (the multi-head losses pass ``label_sar`` to ``score``). The
    logits of steps 0..L-2 score the tokens 1..L-1; tokens equal to ``ignore_index`` count for
    nothing; the mean is over the others (nan when every token is ignored, as in Paddle).
    """

    def __init__(self, ignore_index: int = PADDLE_DEFAULT_IGNORE_INDEX) -> None:
        super().__init__()
        self.ignore_index = int(ignore_index)

    def forward(self, preds: torch.Tensor, batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        return {"loss": self.score(preds, batch["label"])}

    @full_precision
    def score(self, logits: torch.Tensor, labels: Any) -> torch.Tensor:
        """The loss of ``logits`` (B, L, C) for the SAR-encoded ``labels`` (B, L)."""
        labels = torch.as_tensor(labels, device=logits.device).long()
        if labels.ndim != 2 or labels.shape[1] != logits.shape[1]:
            raise ValueError(
                f"SARLoss expects labels (B, {logits.shape[1]}) for logits {tuple(logits.shape)}, "
                f"got {tuple(labels.shape)}"
            )
        steps = logits[:, :-1, :].float().reshape(-1, logits.shape[2])
        targets = labels[:, 1:].reshape(-1)
        return F.cross_entropy(steps, targets, ignore_index=self.ignore_index, reduction="mean")
