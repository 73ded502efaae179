"""Segmentation losses with PaddleSeg's semantics, and ``MultiOutputLoss`` mapping a list of
losses with coefficients onto a model's list of outputs (PaddleSeg's ``loss: {types, coef}``)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.losses.precision import full_precision
from ppdist.registry import LOSSES


def _labels(batch: Mapping[str, Any], device: torch.device) -> torch.Tensor:
    label = torch.as_tensor(batch["label"], device=device).long()
    return label.squeeze(1) if label.ndim == 4 else label


def _class_weight(weight: Optional[Sequence[float]]) -> Optional[torch.Tensor]:
    return None if weight is None else torch.tensor([float(w) for w in weight], dtype=torch.float32)


def _check_weight(weight: Optional[torch.Tensor], logit: torch.Tensor) -> Optional[torch.Tensor]:
    if weight is None:
        return None
    if weight.numel() != logit.shape[1]:
        raise ValueError(
            f"the loss has {weight.numel()} class weights but the model predicts {logit.shape[1]} classes"
        )
    return weight.to(logit.device)


def kth_smallest(values: torch.Tensor, k: int) -> torch.Tensor:
    """``torch.kthvalue(values, k).values`` of a 1-D tensor, as the largest of its ``k`` smallest
    (ties included, exactly): CUDA's ``kthvalue`` selects each slice in one thread block (one
    slice of ~2M pixels here), ``topk``'s radix select spreads over the GPU; no host read."""
    return torch.topk(values, k, largest=False, sorted=False).values.amax()


class PixelLoss(nn.Module):
    """A per-output pixel loss: ``forward(logit, label)``; called as a top-level ``Loss``
    (``forward(preds, batch)``) it scores a single-output model."""

    def __call__(self, preds: Any, target: Any) -> Any:  # type: ignore[override]
        if isinstance(target, Mapping):
            outputs = list(preds) if isinstance(preds, (list, tuple)) else [preds]
            if len(outputs) != 1:
                raise ValueError(
                    f"the model returned {len(outputs)} outputs; use Loss: {{name: MultiOutputLoss, "
                    f"types: [...], coef: [...]}} with one {type(self).__name__} per output"
                )
            return {"loss": super().__call__(outputs[0], _labels(target, outputs[0].device))}
        return super().__call__(preds, target)


@LOSSES.register
class CrossEntropyLoss(PixelLoss):
    """Pixel-wise cross entropy (PaddleSeg's): ignored pixels contribute nothing; with
    ``avg_non_ignore`` the mean is over non-ignored pixels (class-weighted when ``weight``
    is set); ``top_k_percent_pixels < 1`` keeps only the hardest pixels."""

    def __init__(
        self,
        weight: Optional[List[float]] = None,
        ignore_index: int = 255,
        top_k_percent_pixels: float = 1.0,
        avg_non_ignore: bool = True,
    ) -> None:
        super().__init__()
        if not 0.0 < top_k_percent_pixels <= 1.0:
            raise ValueError(f"top_k_percent_pixels must lie in (0, 1], got {top_k_percent_pixels}")
        self.register_buffer("weight", _class_weight(weight), persistent=False)
        self.ignore_index = ignore_index
        self.top_k_percent_pixels = top_k_percent_pixels
        self.avg_non_ignore = avg_non_ignore
        self.eps = 1e-8

    @full_precision
    def forward(self, logit: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        logit = logit.float()
        weight = _check_weight(self.weight, logit)
        loss = F.cross_entropy(logit, label, weight=weight, ignore_index=self.ignore_index, reduction="none")
        valid = label != self.ignore_index
        mask = valid.float() if self.avg_non_ignore else torch.ones_like(loss)
        coef = (
            weight[torch.where(valid, label, 0)]
            if (weight is not None and self.avg_non_ignore)
            else torch.ones_like(loss)
        )
        loss = loss * mask
        if self.top_k_percent_pixels == 1.0:
            return loss.mean() / ((mask * coef).mean() + self.eps)
        flat = loss.reshape(-1)
        loss, indices = flat.topk(int(self.top_k_percent_pixels * flat.numel()))
        return loss.mean() / (coef.reshape(-1)[indices].mean() + self.eps)


@LOSSES.register
class OhemCrossEntropyLoss(PixelLoss):
    """Online hard example mining cross entropy over the whole (per-process) batch.

    Among valid pixels, the ground-truth class probability ``p`` is compared with
    ``threshold = max(thresh, p_(min_kept))`` (the ``min_kept``-th smallest ``p``); only
    pixels with ``p < threshold`` (strictly) are kept, and the loss is their mean cross
    entropy. With ``min_kept >= #valid`` every valid pixel is kept.
    """

    def __init__(
        self,
        thresh: float = 0.7,
        min_kept: int = 10000,
        ignore_index: int = 255,
        weight: Optional[List[float]] = None,
    ) -> None:
        super().__init__()
        self.thresh = float(thresh)
        self.min_kept = int(min_kept)
        self.ignore_index = ignore_index
        self.register_buffer("weight", _class_weight(weight), persistent=False)
        self.eps = 1e-5

    @torch.no_grad()
    def kept_mask(self, logit: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """Boolean mask (N, H, W) of the pixels that enter the loss, decided on the device with
        fixed shapes (no host read): every valid pixel when at most ``min_kept`` are valid."""
        valid = label != self.ignore_index
        if self.min_kept <= 0:
            return valid
        prob = torch.softmax(logit, dim=1).gather(1, torch.where(valid, label, 0).unsqueeze(1)).squeeze(1)
        prob = torch.where(valid, prob, prob + 1.0).reshape(-1)  # ignored pixels sort last
        kth = kth_smallest(prob, min(prob.numel(), self.min_kept))
        hard = valid & (prob.reshape(label.shape) < kth.clamp(min=self.thresh))
        return torch.where(valid.sum() <= self.min_kept, valid, hard)

    @full_precision
    def forward(self, logit: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        logit = logit.float()
        weight = _check_weight(self.weight, logit)
        mask = self.kept_mask(logit, label)
        target = torch.where(mask, label, self.ignore_index)
        loss = F.cross_entropy(logit, target, weight=weight, ignore_index=self.ignore_index, reduction="none")
        maskf = mask.float()
        return (loss * maskf).mean() / (maskf.mean() + self.eps)


@LOSSES.register
class MultiOutputLoss(nn.Module):
    """``sum_i coef_i * types_i(preds_i, label)``: loss ``i`` scores the model's output ``i``.

    ``types`` is a list of loss entries (``{name: OhemCrossEntropyLoss, min_kept: ...}``);
    a single entry with several coefficients is repeated, as in PaddleSeg. ``ignore_index``
    reaches every entry that takes it. Returns ``loss`` and the per-output ``loss_i``.
    """

    def __init__(
        self,
        types: List[Dict[str, Any]],
        coef: Optional[List[float]] = None,
        ignore_index: Optional[int] = None,
    ) -> None:
        super().__init__()
        if not types:
            raise ValueError("types needs at least one loss entry")
        coef = [1.0] * len(types) if coef is None else [float(c) for c in coef]
        if len(types) == 1 and len(coef) > 1:
            types = [dict(types[0]) for _ in coef]
        if len(types) != len(coef):
            raise ValueError(f"types has {len(types)} entries but coef has {len(coef)}")
        built = []
        for i, entry in enumerate(types):
            entry = dict(entry)
            accepted, _ = LOSSES.accepted_keys(entry.get("name", "")) if "name" in entry else ([], False)
            if ignore_index is not None and "ignore_index" in accepted:
                entry["ignore_index"] = ignore_index
            built.append(LOSSES.build(entry, where=f"Loss.types[{i}]"))
        self.losses = nn.ModuleList(built)
        self.coef = coef

    @full_precision
    def forward(self, preds: Any, batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        outputs = list(preds) if isinstance(preds, (list, tuple)) else [preds]
        if len(outputs) != len(self.losses):
            raise ValueError(
                f"the model returned {len(outputs)} output(s) but Loss.types has {len(self.losses)} "
                f"entries; give one loss per output (PP-LiteSeg trains with 3)"
            )
        label = _labels(batch, outputs[0].device)
        parts = {
            f"loss_{i}": c * fn(out, label)
            for i, (fn, out, c) in enumerate(zip(self.losses, outputs, self.coef))
        }
        total = torch.stack(list(parts.values())).sum()
        return dict({"loss": total}, **parts) if len(parts) > 1 else {"loss": total}
