"""The GRU cell from its gates: nn.GRUCell's values and gradients, in fewer kernels."""

import torch
from torch.nn import functional as F

from ppdist.benchmark.op_count import OpCount, _Counting
from ppdist.modeling.gru_gates import _GRUGates, gru_from_gates


def test_equals_grucell_with_its_gradients():
    torch.manual_seed(0)
    rnn = torch.nn.GRUCell(6, 4)
    x, h = torch.randn(3, 6, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    weight = torch.randn(3, 4)
    ours = gru_from_gates(F.linear(x, rnn.weight_ih, rnn.bias_ih), F.linear(h, rnn.weight_hh, rnn.bias_hh), h)
    ours_grads = torch.autograd.grad((ours * weight).sum(), [x, h, *rnn.parameters()])
    theirs = rnn(x, h)
    their_grads = torch.autograd.grad((theirs * weight).sum(), [x, h, *rnn.parameters()])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    for a, b in zip(ours_grads, their_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_gradcheck_and_eight_backward_operators():
    torch.manual_seed(1)
    inputs = [torch.randn(2, n, dtype=torch.float64, requires_grad=True) for n in (9, 9, 3)]
    assert torch.autograd.gradcheck(_GRUGates.apply, inputs)
    out = _GRUGates.apply(*inputs)
    grad = torch.ones_like(out)
    counted = OpCount()
    with _Counting(counted):
        torch.autograd.grad(out, inputs, grad)
    assert counted.total == 8  # autograd through the elementary operations: 11
