"""Weight gradients of a recurrence summed once after the loop, as cuDNN's RNNs do.

Under autograd a weight read at every step of an L-step loop gets L gradient GEMMs and L - 1
accumulations in the backward: about 3 kernels per step and weight. Here the weight is *tapped*
before the loop (``tap``: the same values, through a node that runs after every step's backward);
each step's node computes only the gradient of its input and keeps (output gradient, input) in a
``Stash``; the tap then makes the weight's gradient from all of them in one GEMM.

``step_linear(x, weight, addend, stash)`` is ``addend + x @ weight.T`` (``addend``: a tapped bias
or a per-step tensor, whose gradient is the output's); ``step_read(alpha, feats, stash)`` is the
attention read ``alpha^T @ feats``. The backward runs in the forward's autocast state.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from torch.autograd import Function

Tensor = torch.Tensor


class Stash:
    """(output gradient, input) pairs left by the steps' backward for the tap; ``kind`` says how
    the tap combines them (``linear``: ``sum_t g_t^T x_t`` and ``sum_t g_t``; ``read``:
    ``sum_t alpha_t g_t^T``)."""

    def __init__(self, kind: str, bias: bool = False) -> None:
        if kind not in ("linear", "read"):
            raise ValueError(f"Stash kind must be 'linear' or 'read', got {kind!r}")
        self.kind = kind
        self.bias = bias
        self.grads: List[Tensor] = []
        self.inputs: List[Tensor] = []

    def gradients(self) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """(the tapped weight's gradient, the tapped bias's) from the pairs, which are dropped."""
        if not self.grads:
            return None, None
        if self.kind == "linear":
            grads, inputs = torch.cat(self.grads), torch.cat(self.inputs)
            weight = grads.t().mm(inputs.to(grads.dtype))
            bias = grads.sum(0) if self.bias else None
        else:  # alphas (B, T, 1) and context gradients (B, C): sum_t alpha_t g_t^T, one bmm
            weight = torch.bmm(
                torch.cat(self.inputs, dim=2), torch.stack(self.grads, dim=1).to(self.inputs[0].dtype)
            )
            bias = None
        self.grads, self.inputs = [], []
        return weight, bias


class _AutocastState:
    """The forward's autocast state, re-entered by a backward."""

    def __init__(self, tensor: Tensor) -> None:
        self.device = tensor.device.type
        self.enabled = torch.is_autocast_enabled(self.device)
        self.dtype = torch.get_autocast_dtype(self.device) if self.enabled else None

    def __call__(self) -> Any:
        return torch.autocast(self.device, dtype=self.dtype, enabled=self.enabled)


class _Tap(Function):
    @staticmethod
    def forward(ctx: Any, stash: Stash, weight: Tensor, bias: Optional[Tensor]) -> Tuple[Tensor, ...]:  # type: ignore[override]
        ctx.stash = stash
        ctx.set_materialize_grads(False)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        if bias is None:
            return (weight.view_as(weight),)
        return weight.view_as(weight), bias.view_as(bias)

    @staticmethod
    def backward(ctx: Any, *grads: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:  # type: ignore[override]
        weight, bias = ctx.stash.gradients()
        results: List[Optional[Tensor]] = []
        for made, direct, dtype in zip((weight, bias), list(grads) + [None], ctx.dtypes):
            if made is not None:
                made = made.to(dtype)
            if direct is not None:  # the tapped tensor also used outside the steps
                made = direct if made is None else made + direct
            results.append(made)
        return None, results[0], results[1]


def tap(stash: Stash, weight: Tensor, bias: Optional[Tensor] = None) -> Tuple[Tensor, ...]:
    """``weight`` (and ``bias``) as the steps must read them: gradients from ``stash`` in one GEMM."""
    return _Tap.apply(stash, weight, bias)


class _StepLinear(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, addend: Tensor, stash: Stash, per_step: bool) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.stash, ctx.per_step, ctx.autocast = stash, per_step, _AutocastState(x)
        return torch.addmm(addend, x, weight.t())

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        with ctx.autocast():
            grad_x = grad.mm(weight) if ctx.needs_input_grad[0] else None
        ctx.stash.grads.append(grad)
        ctx.stash.inputs.append(x)
        return grad_x, None, grad if ctx.per_step else None, None, None


def step_linear(x: Tensor, weight: Tensor, addend: Tensor, stash: Stash, per_step: bool = False) -> Tensor:
    """``addend + x @ weight.T`` with ``weight`` from ``tap``; ``addend`` the tapped bias
    (``per_step`` False) or a tensor of this step whose gradient is the output's."""
    return _StepLinear.apply(x, weight, addend, stash, per_step)


class _StepRead(Function):
    @staticmethod
    def forward(ctx: Any, alpha: Tensor, feats: Tensor, stash: Stash) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(alpha, feats)
        ctx.stash, ctx.autocast = stash, _AutocastState(alpha)
        return torch.bmm(alpha.transpose(1, 2), feats).squeeze(1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:  # type: ignore[override]
        alpha, feats = ctx.saved_tensors
        with ctx.autocast():
            grad_alpha = torch.bmm(feats, grad.unsqueeze(2)) if ctx.needs_input_grad[0] else None
        ctx.stash.grads.append(grad)
        ctx.stash.inputs.append(alpha)
        return grad_alpha, None, None


def step_read(alpha: Tensor, feats: Tensor, stash: Stash) -> Tensor:
    """The attention read ``alpha^T @ feats`` (alpha (B, T, 1), feats (B, T, C) from ``tap``) -> (B, C)."""
    return _StepRead.apply(alpha, feats, stash)
