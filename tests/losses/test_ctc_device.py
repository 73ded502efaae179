"""CTC with device-side lengths (``Global.cuda_graph``'s form) equals ATen's CTC (zero_infinity)
in loss and gradient, empty and impossible labels included, and reads nothing on the host."""

import pytest
import torch
import torch.nn.functional as F

from ppdist.losses.ctc import CTCLoss
from ppdist.losses.ctc_device import ctc_loss_device_lengths
from ppdist.utils.host_sync import HostSyncCounter

FRAMES, CLASSES, WIDTH = 25, 37, 12


def batch(dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(FRAMES, 9, CLASSES, generator=generator, dtype=dtype)
    labels = torch.randint(1, CLASSES, (9, WIDTH), generator=generator)
    lengths = torch.tensor([0, 1, 3, 12, 5, 7, 2, 12, 12])
    labels[2, 1] = labels[2, 0]  # a repeated character: the path needs a blank between them
    labels[7] = 5  # 12 repeats: 23 frames, possible in 25
    labels[8] = torch.arange(1, 13).repeat_interleave(1)  # distinct
    for row, length in enumerate(lengths.tolist()):
        labels[row, length:] = 0
    return logits, labels, lengths


def both(logits, labels, lengths):
    logits = logits.clone().requires_grad_()
    reference = F.ctc_loss(
        F.log_softmax(logits, 2),
        labels,
        [FRAMES] * len(lengths),
        lengths.tolist(),
        zero_infinity=True,
        reduction="none",
    )
    (reference_grad,) = torch.autograd.grad(reference.sum(), logits)
    device = ctc_loss_device_lengths(F.log_softmax(logits, 2), labels, lengths)
    (device_grad,) = torch.autograd.grad(device.sum(), logits)
    return reference, reference_grad, device, device_grad


def test_equal_to_atens_ctc_in_float64():
    reference, reference_grad, device, device_grad = both(*batch(torch.float64))
    torch.testing.assert_close(device, reference, rtol=0, atol=1e-10)
    torch.testing.assert_close(device_grad, reference_grad, rtol=0, atol=1e-10)


def test_within_float32_rounding_of_atens_ctc():
    logits, labels, lengths = batch(torch.float32, seed=1)
    reference, reference_grad, device, device_grad = both(logits, labels, lengths)
    torch.testing.assert_close(device, reference, rtol=1e-5, atol=1e-4)
    truth = both(logits.double(), labels, lengths)[1]  # ATen in float64
    device_error = (device_grad.double() - truth).abs().max()
    aten_error = (reference_grad.double() - truth).abs().max()
    assert device_error <= max(aten_error, 1e-5)


def test_an_impossible_label_gives_zero_loss_and_gradient():
    logits = torch.randn(FRAMES, 2, CLASSES)
    labels = torch.full((2, 30), 4)  # 30 repeats need 59 frames
    lengths = torch.tensor([30, 20])
    reference, reference_grad, device, device_grad = both(logits, labels, lengths)
    assert reference.tolist() == device.tolist() == [0.0, 0.0]
    assert torch.equal(device_grad, reference_grad) and torch.isfinite(device_grad).all()


@pytest.mark.parametrize("use_focal_loss", [False, True])
def test_the_ctc_loss_of_a_captured_step_equals_the_eager_one(use_focal_loss):
    logits, labels, lengths = batch(torch.float32, seed=2)
    logits = logits.transpose(0, 1)  # (B, T, C)
    eager = CTCLoss(use_focal_loss=use_focal_loss)
    captured = CTCLoss(use_focal_loss=use_focal_loss, cuda_graph=True)
    assert eager.host_keys == ("length",) and captured.host_keys == ()
    expected = eager(logits, {"label": labels, "length": lengths})["loss"]
    with HostSyncCounter() as counter:
        found = captured(logits, {"label": labels, "length": lengths})["loss"]
    assert counter.count == 0, counter.report()
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5)
