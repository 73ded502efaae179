"""Gradient clipping: Paddle's per-tensor clip_norm and the global norm, no host read."""

import pytest
import torch
from torch import nn

from ppdist.clipping import clip_gradients
from ppdist.utils.host_sync import count_host_syncs


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)


def test_gradient_clipping_global_and_per_tensor():
    model = Tiny()
    for p in model.parameters():
        p.grad = torch.full_like(p, 10.0)
    norm = clip_gradients(model, {"clip_norm_global": 1.0}, None)
    assert norm > 1.0
    total = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters()))
    assert total == pytest.approx(1.0, rel=1e-4)
    for p in model.parameters():
        p.grad = torch.full_like(p, 10.0)
    clip_gradients(model, {"clip_norm": 1.0}, None)
    assert all(p.grad.norm() == pytest.approx(1.0, rel=1e-4) for p in model.parameters())


def test_per_tensor_clip_is_paddles_clip_grad_by_norm():
    """max_norm / max(norm, max_norm), no epsilon (Paddle's clip_by_norm kernel): a gradient of
    norm 10 is halved exactly, one of norm 5 is left as it is."""
    model = nn.Linear(2, 1, bias=True)
    model.weight.grad = torch.tensor([[6.0, 8.0]])
    model.bias.grad = torch.tensor([5.0])
    clip_gradients(model, {"clip_norm": 5.0}, None)
    assert model.weight.grad.tolist() == [[3.0, 4.0]] and model.bias.grad.tolist() == [5.0]


def test_clipping_reads_nothing_on_the_host_and_equals_torch():
    torch.manual_seed(0)
    model, reference = Tiny(), Tiny()
    reference.load_state_dict(model.state_dict())
    for p, q in zip(model.parameters(), reference.parameters()):
        p.grad = torch.randn_like(p) * 5
        q.grad = p.grad.clone()
    counter = count_host_syncs(
        lambda: clip_gradients(model, {"clip_norm": 1.0, "clip_norm_global": 2.0}, None)
    )
    assert counter.count == 0, counter.report()
    for q in reference.parameters():
        torch.nn.utils.clip_grad_norm_([q], 1.0)
    torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 2.0)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
