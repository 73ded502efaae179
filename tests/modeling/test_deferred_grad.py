"""Weight gradients of a recurrence summed once after the loop: the same as autograd's per step."""

import pytest
import torch

from ppdist.benchmark.op_count import OpCount, _Counting
from ppdist.modeling.deferred_grad import Stash, step_linear, step_read, tap


def recurrence(weight, bias, w_in, feats, inputs, deferred):
    """h_t = tanh(W h_{t-1} + b + read_t(feats) + w_in x_t): a loop reading shared tensors each step."""
    hidden = torch.zeros(inputs.shape[0], weight.shape[0], dtype=weight.dtype)
    if deferred:
        stashes = Stash("linear", bias=True), Stash("linear"), Stash("read")
        weight, bias = tap(stashes[0], weight, bias)
        (w_in,) = tap(stashes[1], w_in)
        (feats,) = tap(stashes[2], feats)
    total = 0
    for t in range(inputs.shape[1]):
        alpha = torch.softmax(feats.sum(2, keepdim=True) * (t + 1), dim=1)  # (B, T, 1)
        if deferred:
            pre = step_linear(hidden, weight, bias, stashes[0])
            pre = pre + step_read(alpha, feats, stashes[2])
            pre = step_linear(inputs[:, t], w_in, pre, stashes[1], per_step=True)
        else:
            pre = torch.addmm(bias, hidden, weight.t()) + torch.bmm(alpha.transpose(1, 2), feats).squeeze(1)
            pre = torch.addmm(pre, inputs[:, t], w_in.t())
        hidden = torch.tanh(pre)
        total = total + hidden.sum() * (t + 1)
    return total


@pytest.mark.parametrize("steps", [1, 6])
def test_gradients_equal_autogradss_per_step_ones(steps):
    torch.manual_seed(0)
    tensors = [
        torch.randn(4, 4, dtype=torch.float64),
        torch.randn(4, dtype=torch.float64),
        torch.randn(4, 3, dtype=torch.float64),
        torch.randn(2, 5, 4, dtype=torch.float64),
    ]
    inputs = torch.randn(2, steps, 3, dtype=torch.float64)
    grads = []
    for deferred in (True, False):
        leaves = [t.clone().requires_grad_(True) for t in tensors]
        recurrence(*leaves, inputs, deferred).backward()
        grads.append([leaf.grad for leaf in leaves])
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_a_weight_also_used_outside_the_loop_gets_both_gradients():
    torch.manual_seed(1)
    weight = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    stash = Stash("linear")
    (tapped,) = tap(stash, weight)
    out = step_linear(x, tapped, torch.zeros(2, 3), stash).sum() + (tapped * 2).sum()
    out.backward()
    torch.testing.assert_close(weight.grad, torch.ones(2, 3).t().mm(x) + 2)


def test_the_loop_backward_has_no_weight_gemm_or_accumulation_per_step():
    torch.manual_seed(2)
    weight, bias = torch.randn(4, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    counts = []
    for steps in (3, 9):
        weight.grad = bias.grad = None
        stash = Stash("linear", bias=True)
        w, b = tap(stash, weight, bias)
        hidden = torch.zeros(2, 4)
        for _ in range(steps):
            hidden = step_linear(hidden, w, b, stash)
        backward = OpCount()
        with _Counting(backward):
            hidden.sum().backward()
        counts.append(backward.total)
    assert (counts[1] - counts[0]) / 6 == 1  # the input's gradient only: one mm a step
