"""Mixed precision from ``Global.use_amp`` / ``amp_dtype``: the autocast context and the loss scaler.

AMP runs on every device: CUDA autocast on GPUs, CPU autocast on CPU (bf16, or fp16 with
``torch.amp.GradScaler("cpu")``), so the CPU test suite exercises the same mixed-precision path.
The scaler's state is saved whatever the setting, and a run resumes from a checkpoint written
with any other AMP setting (``load_scaler_state``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, Mapping, Tuple

import torch

logger = logging.getLogger("ppdist")
AMP_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def amp_dtype(glob: Mapping[str, Any]) -> torch.dtype:
    return AMP_DTYPES[glob["amp_dtype"]]


def make_autocast(glob: Mapping[str, Any], device: torch.device) -> Tuple[Callable[[], Any], bool]:
    """A zero-argument context factory for AMP on ``device`` and whether fp16 loss scaling is needed.
    With ``Global.cuda_graph`` autocast keeps no cache of cast weights (a graph's capture must not:
    the cache is freed when the context ends, and its memory reused by the capture)."""
    if not glob["use_amp"]:
        return contextlib.nullcontext, False
    dtype = amp_dtype(glob)
    cache = not glob.get("cuda_graph")
    return functools.partial(
        torch.autocast, device.type, dtype=dtype, cache_enabled=cache
    ), dtype == torch.float16


def make_grad_scaler(glob: Mapping[str, Any], enabled: bool, device: torch.device) -> torch.amp.GradScaler:
    """fp16's loss scaler on ``device`` (``Global.scale_loss``, ``use_dynamic_loss_scaling``); a
    no-op when not ``enabled``. Static scaling never changes the scale, not even on an overflow
    (Paddle's ``use_dynamic_loss_scaling: false``): the overflowing step is skipped."""
    dynamic = bool(glob["use_dynamic_loss_scaling"])
    scaler = torch.amp.GradScaler(
        device.type,
        enabled=enabled,
        init_scale=float(glob["scale_loss"]),
        growth_interval=2000 if dynamic else 2**31 - 1,
    )
    if not dynamic:
        scaler.set_backoff_factor(1.0)  # the constructor insists on < 1; the setter is public
    return scaler


def load_scaler_state(scaler: torch.amp.GradScaler, state: Mapping[str, Any], source: str) -> None:
    """Continue ``scaler`` from a saved state written with any AMP setting: a disabled scaler
    ignores it; an enabled one starts from its configured scale when the checkpoint had none
    (AMP off, bf16, or another device's run) and says so."""
    if not scaler.is_enabled():
        return
    if not state:
        logger.info(
            "%s has no fp16 loss-scaler state (written without fp16 AMP): the scaler starts at %g",
            source,
            scaler.get_scale(),
        )
        return
    scaler.load_state_dict(dict(state))
