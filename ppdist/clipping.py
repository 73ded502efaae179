"""Gradient clipping from the ``Optimizer`` section and ``Global.grad_clip``: Paddle's per-tensor
``clip_norm`` and the global-norm clip, in a few foreach kernels that read nothing on the host."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch import nn


def clip_gradients(
    model: nn.Module, opt_cfg: Mapping[str, Any], global_clip: Optional[float]
) -> Optional[torch.Tensor]:
    """Apply ``clip_norm`` (per tensor) and the global-norm clip in a few foreach kernels, reading
    nothing on the host; return the global norm (a device tensor) when clipped globally."""
    params = [p for p in model.parameters() if p.grad is not None]
    grads = [p.grad for p in params]
    if not grads:
        return None
    per_tensor = opt_cfg.get("clip_norm")
    if per_tensor:
        # each gradient times max_norm / max(its norm, max_norm): Paddle's ClipGradByNorm, no epsilon
        norms = torch.stack(torch._foreach_norm(grads))
        coefs = float(per_tensor) / norms.clamp(min=float(per_tensor))
        torch._foreach_mul_(grads, list(coefs.unbind()))
    max_norm = opt_cfg.get("clip_norm_global") or global_clip
    if not max_norm:
        return None
    total = torch.nn.utils.get_total_norm(grads, foreach=True)
    torch.nn.utils.clip_grads_with_norm_(params, float(max_norm), total, foreach=True)
    return total


def needs_clipping(opt_cfg: Mapping[str, Any], global_clip: Optional[float]) -> bool:
    return bool(opt_cfg.get("clip_norm") or opt_cfg.get("clip_norm_global") or global_clip)
