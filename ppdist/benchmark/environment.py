"""What a measurement ran on: versions, device, threads and the performance switches."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any, Dict, Mapping

import torch

from ppdist.config import compile_options
from ppdist.data.build import loader_options
from ppdist.engine.device_settings import channels_last
from ppdist.optim import use_fused


def git_commit(path: str) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def cpu_model() -> str:
    """The CPU's model name (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", "r", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_environment(config: Mapping[str, Any], device: torch.device) -> Dict[str, Any]:
    glob = config["Global"]
    train_loader = config["Train"]["loader"]
    amp = f"{glob['amp_dtype']}" if glob["use_amp"] else "off"
    options = compile_options(glob)
    loading = loader_options(train_loader, device.type)
    return {
        "ppdist_commit": git_commit(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        ),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({cpu_model()})",
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "train_workers": int(train_loader["num_workers"]),
        "train_batch_size_per_card": int(train_loader["batch_size_per_card"]),
        "amp": amp,
        "channels_last": channels_last(glob, device),
        "fused_optimizer": use_fused(config["Optimizer"].get("fused"), device),
        "compile": "off" if options is None else (options or "default"),
        "pin_memory": loading["pin_memory"],
        "persistent_workers": loading.get("persistent_workers", False),
        "prefetch_factor": loading.get("prefetch_factor", 2 if train_loader["num_workers"] else None),
        "cv2_num_threads": train_loader["cv2_num_threads"],
    }
