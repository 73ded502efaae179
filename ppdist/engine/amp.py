"""Mixed precision from ``Global.use_amp`` / ``amp_dtype``: the autocast context and the loss scaler."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Mapping, Tuple

import torch

logger = logging.getLogger("ppdist")


def make_autocast(glob: Mapping[str, Any], device: torch.device) -> Tuple[Callable[[], Any], bool]:
    """A zero-argument context factory for AMP (CUDA only) and whether fp16 scaling is needed."""
    if not glob["use_amp"]:
        return contextlib.nullcontext, False
    if device.type != "cuda":
        logger.warning("Global.use_amp is set but training runs on CPU: AMP is disabled")
        return contextlib.nullcontext, False
    dtype = torch.bfloat16 if glob["amp_dtype"] == "bfloat16" else torch.float16
    return (lambda: torch.autocast("cuda", dtype=dtype)), dtype == torch.float16


def make_grad_scaler(glob: Mapping[str, Any], enabled: bool) -> torch.amp.GradScaler:
    """fp16's loss scaler (``Global.scale_loss``, ``use_dynamic_loss_scaling``); a no-op when not ``enabled``."""
    return torch.amp.GradScaler(
        "cuda",
        enabled=enabled,
        init_scale=float(glob["scale_loss"]),
        growth_interval=2000 if glob["use_dynamic_loss_scaling"] else 10**9,
    )
