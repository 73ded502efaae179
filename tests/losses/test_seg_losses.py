"""OHEM and pixel cross entropy on hand-made examples; the loss list maps onto outputs."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ppdist.components  # noqa: F401
from ppdist.errors import ConfigError
from ppdist.losses.seg import CrossEntropyLoss, MultiOutputLoss, OhemCrossEntropyLoss, kth_smallest
from ppdist.utils.host_sync import HostSyncCounter


def logits_for(probs):
    """(1, 2, 1, N) logits whose class-1 softmax probabilities are ``probs``."""
    p = torch.tensor(probs, dtype=torch.float64)
    return torch.stack([torch.zeros_like(p), torch.log(p / (1 - p))]).reshape(1, 2, 1, -1).float()


def test_ohem_keeps_pixels_strictly_below_threshold():
    # ground truth is class 1 everywhere except one ignored pixel
    probs = [0.1, 0.5, 0.7, 0.8, 0.95, 0.3]
    logit = logits_for(probs)
    label = torch.tensor([[[1, 1, 1, 1, 1, 255]]])
    loss = OhemCrossEntropyLoss(thresh=0.7, min_kept=2)
    mask = loss.kept_mask(logit, label)
    # 2nd smallest valid p is 0.5 < 0.7 -> threshold 0.7; 0.7 itself is NOT kept (strict <)
    assert mask.reshape(-1).tolist() == [True, True, False, False, False, False]
    expected = (-math.log(0.1) - math.log(0.5)) / 2
    value = loss(logit, label).item()
    assert value == pytest.approx(expected / (1 + 1e-5 * 6 / 2), rel=1e-5)


def test_ohem_threshold_rises_to_kth_probability():
    probs = [0.1, 0.75, 0.8, 0.9]
    logit = logits_for(probs)
    label = torch.ones(1, 1, 4, dtype=torch.long)
    mask = OhemCrossEntropyLoss(thresh=0.7, min_kept=3).kept_mask(logit, label)
    # 3rd smallest p = 0.8 > 0.7 -> threshold 0.8, keep p < 0.8
    assert mask.reshape(-1).tolist() == [True, True, False, False]


def test_ohem_keeps_all_valid_when_min_kept_not_below_valid_count():
    logit = logits_for([0.9, 0.95, 0.99])
    label = torch.tensor([[[1, 1, 255]]])
    assert OhemCrossEntropyLoss(min_kept=2).kept_mask(logit, label).reshape(-1).tolist() == [
        True,
        True,
        False,
    ]


def test_cross_entropy_averages_over_non_ignored_and_weights():
    torch.manual_seed(0)
    logit = torch.randn(2, 3, 4, 5)
    label = torch.randint(0, 3, (2, 4, 5))
    label[0, 0, :3] = 255
    plain = CrossEntropyLoss()(logit, label)
    assert plain.item() == pytest.approx(F.cross_entropy(logit, label, ignore_index=255).item(), rel=1e-6)
    weighted = CrossEntropyLoss(weight=[1.0, 2.0, 0.5])(logit, label)
    ref = F.cross_entropy(logit, label, weight=torch.tensor([1.0, 2.0, 0.5]), ignore_index=255)
    assert weighted.item() == pytest.approx(ref.item(), rel=1e-5)


def test_multi_output_loss_maps_losses_and_coefficients_onto_outputs():
    torch.manual_seed(0)
    outs = [torch.randn(2, 3, 4, 4, requires_grad=True) for _ in range(3)]
    label = torch.randint(0, 3, (2, 4, 4))
    loss = MultiOutputLoss(types=[{"name": "CrossEntropyLoss"}], coef=[1.0, 0.5, 0.25])
    result = loss(outs, {"label": label})
    parts = [F.cross_entropy(o, label).item() * c for o, c in zip(outs, (1.0, 0.5, 0.25))]
    assert result["loss"].item() == pytest.approx(sum(parts), rel=1e-5)
    assert [result[f"loss_{i}"].item() for i in range(3)] == pytest.approx(parts, rel=1e-5)
    result["loss"].backward()
    assert all(o.grad is not None for o in outs)
    with pytest.raises(ValueError, match="3 output"):
        MultiOutputLoss(types=[{"name": "CrossEntropyLoss"}] * 2)(outs, {"label": label})


def test_multi_output_loss_passes_ignore_index_and_checks_entries():
    loss = MultiOutputLoss(types=[{"name": "OhemCrossEntropyLoss", "min_kept": 5}], ignore_index=7)
    assert loss.losses[0].ignore_index == 7 and loss.losses[0].min_kept == 5
    with pytest.raises(ConfigError, match=r"Loss.types\[0\]"):
        MultiOutputLoss(types=[{"name": "OhemCrossEntropyLoss", "min_keep": 5}])


def test_pixel_loss_as_top_level_loss_on_single_output():
    logit = torch.randn(1, 2, 3, 3)
    label = torch.zeros(1, 3, 3, dtype=torch.long)
    out = CrossEntropyLoss()([logit], {"label": label})
    assert set(out) == {"loss"}
    assert out["loss"].item() == pytest.approx(F.cross_entropy(logit, label).item(), rel=1e-6)
    with pytest.raises(ValueError, match="MultiOutputLoss"):
        CrossEntropyLoss()([logit, logit], {"label": label})


def reference_kept_mask(loss, logit, label):
    """The mask as first written (host decisions), to check the device-only one against."""
    valid = label != loss.ignore_index
    num_valid = int(valid.sum())
    if not (loss.min_kept < num_valid and num_valid > 0) or loss.min_kept <= 0:
        return valid
    prob = torch.softmax(logit, dim=1).gather(1, torch.where(valid, label, 0).unsqueeze(1)).squeeze(1)
    prob = torch.where(valid, prob, prob + 1.0).reshape(-1)
    kth = torch.kthvalue(prob, min(prob.numel(), loss.min_kept)).values
    return valid & (prob.reshape(label.shape) < torch.maximum(kth, torch.tensor(loss.thresh)))


@pytest.mark.parametrize("min_kept", [0, 10, 300, 5000])
@pytest.mark.parametrize("ignored", [0.0, 0.3, 1.0])
def test_ohem_is_sync_free_and_equals_the_host_decision(min_kept, ignored):
    generator = torch.Generator().manual_seed(min_kept)
    logits = [torch.randn(2, 5, 24, 32, generator=generator, requires_grad=True) for _ in range(3)]
    label = torch.randint(0, 5, (2, 24, 32), generator=generator)
    label[torch.rand(label.shape, generator=generator) < ignored] = 255
    entry = {"name": "OhemCrossEntropyLoss", "thresh": 0.7, "min_kept": min_kept}
    loss = MultiOutputLoss(types=[entry] * 3, coef=[1, 1, 1])
    with HostSyncCounter() as counter:
        total = loss(logits, {"label": label})["loss"]
        total.backward()
    assert counter.count == 0, counter.report()
    for ohem, logit in zip(loss.losses, logits):
        assert torch.equal(
            ohem.kept_mask(logit.detach(), label), reference_kept_mask(ohem, logit.detach(), label)
        )
    assert torch.isfinite(total)


@pytest.mark.parametrize("k", [1, 7, 500, 1999, 2000])
def test_kth_smallest_equals_kthvalue_with_ties(k):
    generator = torch.Generator().manual_seed(k)
    values = torch.randint(0, 9, (2000,), generator=generator).float() / 8  # 9 values, many ties
    values[::7] = 2.0  # as OHEM's ignored pixels (p + 1)
    assert torch.equal(kth_smallest(values, k), torch.kthvalue(values, k).values)


def test_ohem_with_tied_probabilities_equals_the_host_decision():
    generator = torch.Generator().manual_seed(0)
    logit = torch.randint(0, 3, (2, 4, 16, 16), generator=generator).float()  # few distinct probabilities
    label = torch.randint(0, 4, (2, 16, 16), generator=generator)
    label[:, :2] = 255
    for min_kept in (1, 40, 100, 300):
        ohem = OhemCrossEntropyLoss(thresh=0.2, min_kept=min_kept)
        assert torch.equal(ohem.kept_mask(logit, label), reference_kept_mask(ohem, logit, label))


def test_cross_entropy_with_weights_and_top_k_is_sync_free():
    logit = torch.randn(2, 3, 8, 8, requires_grad=True)
    label = torch.randint(0, 3, (2, 8, 8))
    label[:, 0] = 255
    for loss in (CrossEntropyLoss(weight=[1.0, 2.0, 0.5]), CrossEntropyLoss(top_k_percent_pixels=0.25)):
        with HostSyncCounter() as counter:
            loss(logit, label).backward()
        assert counter.count == 0, counter.report()


def test_seg_losses_are_fp32_under_autocast():
    logit, label = torch.randn(2, 3, 16, 16), torch.randint(0, 3, (2, 16, 16))
    loss = OhemCrossEntropyLoss(min_kept=50)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = loss(logit.bfloat16(), label)
    assert inside.dtype == torch.float32 and torch.equal(inside, loss(logit.bfloat16(), label))


def paddleseg_ohem(logit, label, thresh, min_kept, ignore_index=255):
    """PaddleSeg's OhemCrossEntropyLoss as written there (numpy, a full argsort of every pixel) on
    torch's float32 probabilities: the kept mask and the loss (float64), for the selection without
    a sort to equal."""
    c = logit.shape[1]
    prob = torch.softmax(logit.float(), dim=1).transpose(0, 1).reshape(c, -1).numpy()
    log_p = torch.log_softmax(logit.double(), dim=1).transpose(0, 1).reshape(c, -1).numpy()
    label = label.numpy().reshape(-1)
    valid = (label != ignore_index).astype(np.int64)
    label = label * valid
    num_valid = valid.sum()
    if min_kept < num_valid and num_valid > 0:
        prob = prob + (1 - valid).astype(np.float32)
        prob = prob[label, np.arange(label.size)]
        threshold = thresh
        if min_kept > 0:
            index = prob.argsort()
            threshold_index = index[min(len(index), min_kept) - 1]
            if prob[threshold_index] > thresh:
                threshold = prob[threshold_index]
            valid = valid * (prob < threshold).astype(np.int64)
    loss = -log_p[label, np.arange(label.size)] * valid
    return valid.astype(bool), loss.mean() / (valid.mean() + 1e-5)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("ignored", [0.0, 0.5])
@pytest.mark.parametrize("min_kept", [1, 100, 383, 384, 5000])  # 384 = valid pixels at ignored 0.5
@pytest.mark.parametrize("thresh", [0.05, 0.7, 1.0])  # 1.0: above every probability
def test_ohem_selection_without_a_sort_equals_paddlesegs_full_argsort(thresh, min_kept, ignored, tied):
    generator = torch.Generator().manual_seed(min_kept + int(100 * thresh) + int(10 * ignored) + tied)
    logit = torch.randn(2, 5, 16, 24, generator=generator) * 3
    if tied:  # few distinct probabilities: ties at the k-th
        logit = logit.round().clamp(-1, 1)
    label = torch.randint(0, 5, (2, 16, 24), generator=generator)
    if ignored:
        drop = torch.randperm(label.numel(), generator=generator)[: int(ignored * label.numel())]
        label.view(-1)[drop] = 255
    ohem = OhemCrossEntropyLoss(thresh=thresh, min_kept=min_kept)
    expected_mask, expected_loss = paddleseg_ohem(logit, label, thresh, min_kept)
    mask = ohem.kept_mask(logit, label).reshape(-1).numpy()
    assert np.array_equal(mask, expected_mask), int((mask != expected_mask).sum())
    assert ohem(logit, label).item() == pytest.approx(expected_loss, rel=1e-5)
