"""CTC loss on raw logits (PaddleOCR's ``CTCLoss``: batch mean, no length normalisation)."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.losses.ctc_device import ctc_loss_device_lengths
from ppdist.losses.precision import full_precision
from ppdist.registry import LOSSES

Preds = Union[torch.Tensor, Sequence[torch.Tensor]]


@LOSSES.register(name="CTCLoss")
class CTCLoss(nn.Module):
    """``forward(preds, batch) -> {"loss": scalar}``.

    ``preds``: logits (B, T, C), class 0 = blank (a list/tuple means its last item).
    ``batch["label"]``: (B, L) zero-padded class indices; ``batch["length"]``: (B,) lengths.
    Every sample uses all T frames. Impossible alignments (label too long for T) give
    zero loss instead of ``inf``. ``use_focal_loss`` weights each sample by
    ``(1 - exp(-loss)) ** 2``.

    The lengths are needed on the host (ATen's CTC reads them there): ``host_keys`` asks the
    trainer to leave ``batch["length"]`` on the host, so a step copies nothing back. With
    ``cuda_graph`` (``Global.cuda_graph``, injected) the lengths stay on the device and the loss is
    ``ppdist.losses.ctc_device``'s fixed-shape CTC, which a captured step can hold (equal to
    ATen's within float32 rounding).
    """

    host_keys: Tuple[str, ...] = ("length",)

    def __init__(self, use_focal_loss: bool = False, cuda_graph: bool = False) -> None:
        super().__init__()
        self.use_focal_loss = use_focal_loss
        self.device_lengths = bool(cuda_graph)
        if self.device_lengths:
            self.host_keys = ()

    def forward(self, preds: Preds, batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        if isinstance(preds, (list, tuple)):
            preds = preds[-1]
        return {"loss": self.score(preds, batch["label"], batch["length"])}

    @full_precision
    def score(self, logits: torch.Tensor, labels: Any, lengths: Any) -> torch.Tensor:
        """The batch-mean loss of ``logits`` (B, T, C) for zero-padded ``labels`` (B, L) of
        ``lengths`` (B,) (kept on the host); the composite losses call it with their own labels."""
        batch_size, frames, _ = logits.shape
        log_probs = F.log_softmax(logits.float(), dim=2).transpose(0, 1)  # (T, B, C)
        labels = torch.as_tensor(labels, device=logits.device).long()
        if self.device_lengths:
            per_sample = ctc_loss_device_lengths(
                log_probs, labels, torch.as_tensor(lengths, device=logits.device)
            )
        else:
            # lengths as Python ints: the CUDA kernel's tensor overload refuses host tensors beside
            # device inputs, and host values are what it reads anyway
            label_lengths = host_lengths(lengths).tolist()
            input_lengths = [frames] * batch_size
            per_sample = F.ctc_loss(
                log_probs, labels, input_lengths, label_lengths, blank=0, reduction="none", zero_infinity=True
            )
        if self.use_focal_loss:
            per_sample = per_sample * (1.0 - torch.exp(-per_sample)).square()
        return per_sample.mean()


def host_lengths(lengths: Any) -> torch.Tensor:
    """Label lengths as a flat int64 host tensor (a device tensor is copied back: one sync)."""
    if isinstance(lengths, torch.Tensor) and lengths.device.type != "cpu":
        lengths = lengths.cpu()
    return torch.as_tensor(lengths).long().reshape(-1)
