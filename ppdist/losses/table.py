"""SLANet's loss (PaddleOCR's ``SLALoss``): structure cross entropy plus a masked box loss."""

from __future__ import annotations

from typing import Any, Dict, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.errors import ConfigError
from ppdist.losses.precision import full_precision
from ppdist.registry import LOSSES

LOC_LOSSES = ("smooth_l1", "mse")
EPS = 1e-12


def check_loss_options(options: Mapping[str, Any], where: str = "Loss") -> None:
    """The values SLALoss refuses, as one ``ConfigError`` naming the key."""
    loc_loss = options.get("loc_loss", "mse")
    if loc_loss not in LOC_LOSSES:
        raise ConfigError(f"{where}.loc_loss: expected one of {LOC_LOSSES}, got {loc_loss!r}")


@LOSSES.register(name="SLALoss")
class SLALoss(nn.Module):
    """``forward(preds, batch) -> {"loss", "structure_loss", "loc_loss"}``.

    ``preds``: ``structure_probs`` (B, L, C), the head's training logits (the cross entropy applies
    the softmax, as Paddle's), and ``loc_preds`` (B, L, R). ``batch``: ``structure`` (B, L + 1),
    ``bboxes`` (B, L + 1, R) and ``bbox_masks`` (B, L + 1) or (B, L + 1, 1) as TableLabelEncode
    writes them; step t scores the label's token t + 1 (the start token is never a target; the
    padding, which is the start index, is scored like any token, as in Paddle).

    ``structure_loss``: mean cross entropy x ``structure_weight``. ``loc_loss``: the sum of the
    elementwise loss of the masked boxes x ``loc_weight`` / (number of masked tokens + 1e-12).
    ``loc_loss: smooth_l1`` (SLANet.yml) is Paddle's (delta 1); ``mse`` sums squared differences
    instead (PaddleOCR stores the key but always uses smooth L1). ``loss`` is their sum.
    """

    def __init__(self, structure_weight: float = 1.0, loc_weight: float = 2.0, loc_loss: str = "mse") -> None:
        super().__init__()
        check_loss_options({"loc_loss": loc_loss})
        self.structure_weight = float(structure_weight)
        self.loc_weight = float(loc_weight)
        self.loc_loss = loc_loss

    @staticmethod
    def check_values(options: Mapping[str, Any], where: str) -> None:
        """Config validation: the values ``__init__`` would refuse."""
        check_loss_options(options, where)

    @full_precision
    def forward(self, preds: Mapping[str, torch.Tensor], batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        logits = preds["structure_probs"].float()
        loc_preds = preds["loc_preds"].float()
        structure = torch.as_tensor(batch["structure"], device=logits.device).long()[:, 1:]
        if structure.shape != logits.shape[:2]:
            raise ValueError(
                f"SLALoss expects batch['structure'] (B, {logits.shape[1] + 1}) for structure_probs "
                f"{tuple(logits.shape)}, got {tuple(batch['structure'].shape)}"
            )
        structure_loss = F.cross_entropy(logits.transpose(1, 2), structure) * self.structure_weight
        targets = torch.as_tensor(batch["bboxes"], device=loc_preds.device).float()[:, 1:]
        masks = torch.as_tensor(batch["bbox_masks"], device=loc_preds.device).float()
        masks = (masks if masks.ndim == 3 else masks.unsqueeze(-1))[:, 1:]
        element = F.smooth_l1_loss if self.loc_loss == "smooth_l1" else F.mse_loss
        loc_sum = element(loc_preds * masks, targets * masks, reduction="sum") * self.loc_weight
        loc_loss = loc_sum / (masks.sum() + EPS)
        return {"loss": structure_loss + loc_loss, "structure_loss": structure_loss, "loc_loss": loc_loss}
