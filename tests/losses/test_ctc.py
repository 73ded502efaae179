"""CTCLoss: values, impossible alignments, focal weighting and gradients."""

import itertools
import math

import numpy as np
import torch

from ppdist.losses import CTCLoss
from ppdist.registry import LOSSES
from ppdist.utils.host_sync import HostSyncCounter


def brute_force_ctc(logits: torch.Tensor, label: list) -> float:
    """-log sum over all frame paths that collapse (merge repeats, drop blank 0) to ``label``."""
    probs = torch.softmax(logits.double(), dim=-1)
    frames, classes = probs.shape
    total = 0.0
    for path in itertools.product(range(classes), repeat=frames):
        collapsed = [c for i, c in enumerate(path) if c != 0 and (i == 0 or c != path[i - 1])]
        if collapsed == label:
            total += math.prod(float(probs[t, c]) for t, c in enumerate(path))
    return -math.log(total) if total > 0 else math.inf


def test_matches_brute_force_and_torch_reference():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 3)
    batch = {"label": torch.tensor([[1, 2, 0], [2, 2, 0]]), "length": torch.tensor([2, 2])}
    loss = CTCLoss()(logits, batch)["loss"]
    expected = (brute_force_ctc(logits[0], [1, 2]) + brute_force_ctc(logits[1], [2, 2])) / 2
    assert math.isclose(loss.item(), expected, rel_tol=1e-5)

    reference = torch.nn.CTCLoss(blank=0, reduction="none")(
        logits.log_softmax(2).transpose(0, 1), batch["label"], torch.tensor([4, 4]), batch["length"]
    )
    assert torch.allclose(loss, reference.mean())


def test_batch_mean_is_not_divided_by_label_length():
    torch.manual_seed(1)
    logits = torch.randn(3, 25, 37)
    labels = torch.zeros(3, 25, dtype=torch.long)
    labels[0, :3] = torch.tensor([5, 6, 7])
    labels[1, :1] = torch.tensor([9])
    labels[2, :6] = torch.tensor([1, 2, 3, 4, 5, 6])
    lengths = torch.tensor([3, 1, 6])
    loss = CTCLoss()(logits, {"label": labels, "length": lengths})["loss"]
    per_sample = torch.nn.functional.ctc_loss(
        logits.log_softmax(2).transpose(0, 1), labels, torch.full((3,), 25), lengths, reduction="none"
    )
    assert torch.allclose(loss, per_sample.mean())
    # "mean" reduction of torch divides by the label lengths first: a different number
    assert not torch.allclose(
        loss,
        torch.nn.functional.ctc_loss(
            logits.log_softmax(2).transpose(0, 1), labels, torch.full((3,), 25), lengths
        ),
    )


def test_impossible_alignment_gives_zero_not_inf():
    torch.manual_seed(2)
    logits = torch.randn(2, 3, 4, requires_grad=True)
    # "1 1 2" needs a blank between the repeated 1s: 4 frames, only 3 available
    batch = {"label": np.array([[1, 1, 2], [3, 0, 0]], dtype=np.int32), "length": np.array([3, 1])}
    loss = CTCLoss()(logits, batch)["loss"]
    assert torch.isfinite(loss)
    assert math.isclose(loss.item(), brute_force_ctc(logits[1].detach(), [3]) / 2, rel_tol=1e-5)
    loss.backward()
    assert torch.all(logits.grad[0] == 0)
    assert torch.any(logits.grad[1] != 0)


def test_focal_loss_weights_each_sample():
    torch.manual_seed(3)
    logits = torch.randn(2, 6, 5)
    batch = {"label": torch.tensor([[1, 2], [3, 0]]), "length": torch.tensor([2, 1])}
    per_sample = torch.tensor([brute_force_ctc(logits[0], [1, 2]), brute_force_ctc(logits[1], [3])])
    focal = CTCLoss(use_focal_loss=True)(logits, batch)["loss"]
    expected = (per_sample * (1 - torch.exp(-per_sample)) ** 2).mean()
    assert math.isclose(focal.item(), expected.item(), rel_tol=1e-5)
    assert focal < CTCLoss()(logits, batch)["loss"]


def test_gradient_flows_and_half_precision_logits():
    torch.manual_seed(4)
    logits = torch.randn(4, 25, 37, requires_grad=True)
    labels = torch.randint(1, 37, (4, 25))
    lengths = torch.tensor([5, 10, 1, 7])
    for i, n in enumerate(lengths):
        labels[i, n:] = 0
    loss = LOSSES.build({"name": "CTCLoss"})([logits], {"label": labels, "length": lengths})["loss"]
    loss.backward()
    assert loss.dim() == 0 and loss.item() > 0
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    half = CTCLoss()(logits.detach().half(), {"label": labels, "length": lengths})["loss"]
    assert half.dtype == torch.float32
    assert math.isclose(half.item(), loss.item(), rel_tol=1e-2)


def test_host_lengths_make_the_loss_and_its_gradient_sync_free():
    torch.manual_seed(0)
    logits = torch.randn(4, 10, 6, requires_grad=True)
    batch = {
        "label": torch.tensor([[1, 2, 0], [3, 0, 0], [4, 5, 1], [2, 2, 0]]),
        "length": torch.tensor([2, 1, 3, 2]),
    }
    for focal in (False, True):
        with HostSyncCounter(host=[batch["length"]]) as counter:
            loss = CTCLoss(use_focal_loss=focal)(logits, batch)["loss"]
            loss.backward()
        assert counter.count == 0, counter.report()
        reference = torch.nn.functional.ctc_loss(
            logits.detach().log_softmax(2).transpose(0, 1),
            batch["label"],
            torch.full((4,), 10),
            batch["length"],
            reduction="none",
            zero_infinity=True,
        )
        if focal:
            reference = reference * (1 - torch.exp(-reference)).square()
        assert torch.allclose(loss.detach(), reference.mean())
    assert CTCLoss.host_keys == ("length",)
    with HostSyncCounter() as counter:  # lengths left on the device: the one copy back is counted
        CTCLoss()(logits, batch)
    assert counter.count == 1, counter.report()


def test_loss_is_fp32_under_autocast():
    logits = torch.randn(2, 8, 5)
    batch = {"label": torch.tensor([[1, 2], [3, 0]]), "length": torch.tensor([2, 1])}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = CTCLoss()(logits.bfloat16(), batch)["loss"]
    outside = CTCLoss()(logits.bfloat16(), batch)["loss"]
    assert inside.dtype == torch.float32 and torch.equal(inside, outside)
