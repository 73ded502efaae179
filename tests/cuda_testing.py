"""Shared pieces of the CUDA suite (tests/cuda): the precision overrides and the device's
record of synchronising calls."""

import contextlib
import warnings

import torch

PRECISIONS = {
    "fp32": ["Global.use_amp=false"],
    "fp16": ["Global.use_amp=true", "Global.amp_dtype=float16", "Global.scale_loss=1024"],
    "bf16": ["Global.use_amp=true", "Global.amp_dtype=bfloat16"],
}


@contextlib.contextmanager
def device_syncs():
    """Records the synchronising CUDA calls (``set_sync_debug_mode("warn")``) made inside."""
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode(previous)


def sync_warnings(caught):
    """The synchronising calls among the warnings (not the mode's own 'prototype feature' notice)."""
    return [str(w.message) for w in caught if "called a synchronizing" in str(w.message)]
