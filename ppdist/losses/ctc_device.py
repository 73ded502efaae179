"""CTC with the label lengths on the device: fixed shapes, no host read, so a captured step
(``Global.cuda_graph``) can hold it.

ATen's CTC reads the lengths on the host (its kernels size their work by them). Here the forward
variables run over all ``2L + 1`` states of the blank-extended zero-padded labels (``L``: the
padded label width) for every sample, in log space, one small batch of kernels per frame; each
sample's probability is read at its own last two states (``2 * length`` and ``2 * length - 1``),
gathered on the device. Autograd gives the gradient. Unreachable states hold a large negative
number instead of ``-inf`` (no NaN in the backward of a log-sum-exp of nothing); an alignment
that cannot exist (a label too long for the frames) gives a zero loss and no gradient, as ATen's
``zero_infinity=True``. Equal to ATen's CTC within float32 rounding (tests/losses/test_ctc_device.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

UNREACHABLE = -1.0e30  # log-probability of a state no path reaches (finite: no NaN gradients)
IMPOSSIBLE = 1.0e29  # a per-sample loss above this has no alignment at all


def ctc_loss_device_lengths(
    log_probs: torch.Tensor, labels: torch.Tensor, lengths: torch.Tensor, blank: int = 0
) -> torch.Tensor:
    """Per-sample CTC loss (B,) of ``log_probs`` (T, B, C; log-softmax, every sample using all T
    frames) for zero-padded ``labels`` (B, L) of ``lengths`` (B,), all on one device."""
    frames, batch_size, _ = log_probs.shape
    labels = labels.long()
    lengths = lengths.long().reshape(-1).to(log_probs.device)
    states = 2 * labels.shape[1] + 1
    extended = torch.full((batch_size, states), blank, dtype=torch.long, device=log_probs.device)
    extended[:, 1::2] = labels
    # a label state may be reached from two states back unless it repeats the label before it
    skip_allowed = torch.zeros((batch_size, states), dtype=torch.bool, device=log_probs.device)
    skip_allowed[:, 3::2] = labels[:, 1:] != labels[:, :-1]
    emissions = log_probs.gather(2, extended.unsqueeze(0).expand(frames, -1, -1))  # (T, B, S)
    unreachable = torch.full_like(emissions[0], UNREACHABLE)
    alpha = torch.cat([emissions[0, :, :2], unreachable[:, 2:]], dim=1)
    for frame in range(1, frames):
        one_back = F.pad(alpha[:, :-1], (1, 0), value=UNREACHABLE)
        two_back = torch.where(skip_allowed, F.pad(alpha[:, :-2], (2, 0), value=UNREACHABLE), unreachable)
        alpha = torch.logsumexp(torch.stack([alpha, one_back, two_back]), dim=0) + emissions[frame]
    last = alpha.gather(1, (2 * lengths).unsqueeze(1)).squeeze(1)
    before_last = alpha.gather(1, (2 * lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    before_last = torch.where(lengths > 0, before_last, torch.full_like(before_last, UNREACHABLE))
    loss = -torch.logsumexp(torch.stack([last, before_last]), dim=0)
    return torch.where(loss < IMPOSSIBLE, loss, torch.zeros_like(loss))
