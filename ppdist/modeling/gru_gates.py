"""A GRU cell's new hidden state from its gate pre-activations, in few kernels.

``gru_from_gates(gates_i, gates_h, hidden)``: ``gates_i = W_ih x + b_ih`` and ``gates_h = W_hh h +
b_hh`` (r, z, n blocks), so a caller can compute the GEMMs as it likes (merged with other reads of
the same input, hoisted out of a loop). On CUDA it is ATen's fused kernel (what ``nn.GRUCell``
runs there); elsewhere ATen's CPU formula ``n + z (h - n)`` with r and z through one sigmoid and a
written-out backward of 8 kernels where autograd runs 11 (it writes the gate gradients in place of
the concatenations that splitting the gates costs).
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
from torch.autograd import Function

Tensor = torch.Tensor
aten = torch.ops.aten


class _GRUGates(Function):
    @staticmethod
    def forward(ctx: Any, gates_i: Tensor, gates_h: Tensor, hidden: Tensor) -> Tensor:  # type: ignore[override]
        size = hidden.shape[1]
        i_rz, i_n = gates_i.split([2 * size, size], 1)
        h_rz, h_n = gates_h.split([2 * size, size], 1)
        rz = torch.sigmoid(i_rz + h_rz)
        reset, update = rz.chunk(2, 1)
        new = torch.tanh(i_n + h_n * reset)
        diff = hidden - new
        ctx.save_for_backward(rz, new, diff, h_n)
        return torch.addcmul(new, diff, update)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        rz, new, diff, h_n = ctx.saved_tensors
        size = new.shape[1]
        reset, update = rz.chunk(2, 1)
        grad_hidden = grad * update
        grad_new = grad - grad_hidden
        grad_i = grad.new_empty((grad.shape[0], 3 * size))
        grad_h = grad.new_empty((grad.shape[0], 3 * size))
        grad_rz = grad.new_empty((grad.shape[0], 2 * size))
        grad_n = aten.tanh_backward.grad_input(grad_new, new, grad_input=grad_i[:, 2 * size :])
        torch.mul(grad_n, reset, out=grad_h[:, 2 * size :])
        torch.mul(grad_n, h_n, out=grad_rz[:, :size])
        torch.mul(grad, diff, out=grad_rz[:, size:])
        aten.sigmoid_backward.grad_input(grad_rz, rz, grad_input=grad_i[:, : 2 * size])
        grad_h[:, : 2 * size].copy_(grad_i[:, : 2 * size])
        return grad_i, grad_h, grad_hidden


def gru_from_gates(gates_i: Tensor, gates_h: Tensor, hidden: Tensor) -> Tensor:
    """The GRU cell's new hidden state (B, H) from ``gates_i``, ``gates_h`` (B, 3H) and ``hidden``."""
    hidden = hidden.to(gates_i.dtype)
    if gates_i.is_cuda:
        return torch._thnn_fused_gru_cell(gates_i, gates_h, hidden)[0]
    if gates_h.dtype != gates_i.dtype:
        gates_h = gates_h.to(gates_i.dtype)
    return _GRUGates.apply(gates_i, gates_h, hidden)
