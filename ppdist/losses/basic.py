"""Losses between two outputs (PaddleOCR's basic_loss.py): ``DMLLoss`` (mutual learning, KL-based)
and ``DistanceLoss`` (l1 / l2 / smooth l1). ``forward(out1, out2) -> scalar``; the distillation
losses apply them to pairs of models' outputs (``ppdist.losses.distillation``)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.losses.precision import full_precision
from ppdist.registry import LOSSES

DML_ACTIVATIONS = ("softmax", "sigmoid")
DISTANCE_MODES = ("l1", "l2", "smooth_l1")
REDUCTIONS = ("mean", "sum", "none")
_ACT_EPS = 1e-10  # added to the activated outputs
_KL_EPS = 1e-10  # inside _kldiv's log
_JS_EPS = 1e-5  # of the symmetric KL form without use_log


def _refuse_batch(loss: nn.Module, other: Any) -> None:
    """A pair loss named as the top-level Loss gets ``(preds, batch)``: one clear line instead."""
    if isinstance(other, Mapping):
        name = type(loss).__name__
        raise TypeError(
            f"{name} compares two outputs; as a Loss use Distillation{name} inside CombinedLoss "
            f"(loss_config_list), which names the models to compare"
        )


def kl_batch_mean(log_x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``sum(target * (log(target + 1e-10) - log_x)) / B`` (PaddleOCR's ``DMLLoss._kldiv``)."""
    return (target * (torch.log(target + _KL_EPS) - log_x)).sum() / target.shape[0]


def symmetric_kl(p1: torch.Tensor, p2: torch.Tensor) -> torch.Tensor:
    """PaddleOCR's ``KLJSLoss(mode="kl")`` with reduction "mean": half the sum of both KL
    directions (eps 1e-5 inside), averaged over dims 1 and 2 (one value per sample for (B, T, C))."""
    e = _JS_EPS
    loss = p2 * torch.log((p2 + e) / (p1 + e) + e) + p1 * torch.log((p1 + e) / (p2 + e) + e)
    return (0.5 * loss).mean(dim=(1, 2))


@LOSSES.register(name="DMLLoss")
class DMLLoss(nn.Module):
    """Deep mutual learning between two outputs.

    ``act`` (softmax / sigmoid over the last axis, then + 1e-10) turns logits into probabilities.
    With ``use_log`` (recognition) the loss is the mean of KL(out2 || out1) and KL(out1 || out2),
    each summed over every element and divided by the batch size; without it, the symmetric KL
    of ``symmetric_kl`` (detection maps).
    """

    def __init__(self, act: Optional[str] = None, use_log: bool = False) -> None:
        super().__init__()
        if act is not None and act not in DML_ACTIVATIONS:
            raise ValueError(f"act must be one of {DML_ACTIVATIONS} or null, got {act!r}")
        self.act = act
        self.use_log = use_log

    def _activate(self, x: torch.Tensor) -> torch.Tensor:
        if self.act == "softmax":
            return torch.softmax(x, dim=-1) + _ACT_EPS
        if self.act == "sigmoid":
            return torch.sigmoid(x) + _ACT_EPS
        return x

    @full_precision
    def forward(self, out1: torch.Tensor, out2: Any) -> torch.Tensor:  # type: ignore[override]
        _refuse_batch(self, out2)
        out1, out2 = self._activate(out1.float()), self._activate(out2.float())
        if self.use_log:
            return (kl_batch_mean(torch.log(out1), out2) + kl_batch_mean(torch.log(out2), out1)) / 2.0
        return symmetric_kl(out1, out2)


@LOSSES.register(name="DistanceLoss")
class DistanceLoss(nn.Module):
    """``mode`` l1 (mean absolute error), l2 (mean squared error) or smooth_l1 (Paddle's
    SmoothL1Loss: quadratic below ``delta``, default 1.0, linear above) between two outputs;
    ``reduction`` as Paddle's losses (mean, sum, none)."""

    def __init__(self, mode: str = "l2", reduction: str = "mean", delta: Optional[float] = None) -> None:
        super().__init__()
        if mode not in DISTANCE_MODES:
            raise ValueError(f"mode must be one of {DISTANCE_MODES}, got {mode!r}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if delta is not None and mode != "smooth_l1":
            raise ValueError(f"delta is a parameter of mode smooth_l1, not of {mode!r}")
        self.mode = mode
        self.reduction = reduction
        self.delta = 1.0 if delta is None else float(delta)

    @full_precision
    def forward(self, out1: torch.Tensor, out2: Any) -> torch.Tensor:  # type: ignore[override]
        _refuse_batch(self, out2)
        x, y = out1.float(), out2.float()
        if self.mode == "l1":
            return F.l1_loss(x, y, reduction=self.reduction)
        if self.mode == "l2":
            return F.mse_loss(x, y, reduction=self.reduction)
        return F.huber_loss(x, y, reduction=self.reduction, delta=self.delta)
