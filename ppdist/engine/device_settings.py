"""The device-dependent switches of ``Global``: memory format, cuDNN autotuning, TF32 and DDP's
buffer broadcast. Unset (null) keys take per-device defaults; docs/benchmarks.md has the
measurements behind them and how to re-measure on your hardware."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

import torch

logger = logging.getLogger("ppdist")


def channels_last(glob: Mapping[str, Any], device: torch.device) -> bool:
    """``Global.channels_last``; unset: on with CPU (measured faster for all three models) and on
    CUDA with AMP (cuDNN's NHWC tensor-core convolutions), off on CUDA in fp32 (NHWC fp32 with
    depthwise convolutions can be slower; measure with tools/benchmark.py)."""
    setting = glob["channels_last"]
    if setting is not None:
        return bool(setting)
    return device.type != "cuda" or bool(glob["use_amp"])


def cudnn_autotune(glob: Mapping[str, Any], input_sizes: int = 1) -> bool:
    """``Global.cudnn_benchmark``; unset: on, except when training draws ``input_sizes`` > 1 input
    sizes and ``Global.cudnn_warmup`` is unset: each new size would then pay cuDNN's search in the
    middle of training, on every rank and after every restart (PP-YOLOE-s: 15 sizes x 44
    convolution shapes x 3 passes), so cuDNN's heuristics pick instead, as Paddle's default does.
    Which of the two is faster for a recipe is measured on a GPU (docs/benchmarks.md)."""
    setting = glob.get("cudnn_benchmark")
    if setting is not None:
        return bool(setting)
    return input_sizes <= 1 or glob.get("cudnn_warmup") == "all_sizes"


def apply_backend_settings(glob: Mapping[str, Any], device: torch.device, input_sizes: int = 1) -> None:
    """``Global.cudnn_benchmark``, ``Global.float32_matmul_precision`` and ``Global.deterministic``
    for this process ('high' lets fp32 matmuls and convolutions use TF32 on Ampere and newer GPUs,
    as Paddle does by default; 'highest' keeps full fp32). ``deterministic`` picks reproducible
    kernels (cuDNN without autotuning, cuBLAS with a fixed workspace, torch's deterministic
    algorithms, warning where an operator has none), so that a resumed GPU run repeats the
    uninterrupted one bit for bit, at some speed. ``input_sizes``: how many input sizes training
    draws (``cudnn_autotune``)."""
    precision = glob["float32_matmul_precision"]
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = precision != "highest"
    deterministic = bool(glob.get("deterministic", False))
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if deterministic or torch.are_deterministic_algorithms_enabled():
        # only when the flag changes: the call imports torch._inductor (~2 s of every start-up)
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = cudnn_autotune(glob, input_sizes) and not deterministic


def broadcast_buffers(glob: Mapping[str, Any], sync_bn: bool) -> bool:
    """``Global.broadcast_buffers`` (DDP re-sends rank 0's buffers before every forward);
    unset: off with SyncBatchNorm, whose statistics are already the same everywhere, on otherwise."""
    setting = glob["broadcast_buffers"]
    return (not sync_bn) if setting is None else bool(setting)
