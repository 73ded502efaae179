"""How many data-loader workers a benchmark gives each training process: sized from the node's cores.

``auto`` (the default of ``tools/benchmark.py --workers``): the cores this process may use (its
CPU affinity) divided by the training processes on the node, minus the one the training process
itself runs on, at least 1. A recipe's ``num_workers`` is written for some other machine (4 on
PP-LiteSeg, 1 on SLANet); on a 16-core GPU node one process gets 15. ``config`` keeps the
recipe's value; a number sets it.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

from ppdist.errors import ConfigError


def node_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cores_per_process(processes: int) -> int:
    """The node's cores shared among ``processes`` training processes, at least 1."""
    return max(1, node_cores() // max(1, processes))


def auto_workers(processes: int) -> int:
    """Loader workers per process: its share of the cores minus its own, at least 1."""
    return max(1, cores_per_process(processes) - 1)


def loader_workers(setting: str, config: Mapping[str, Any], processes: int) -> int:
    """``--workers`` (``auto``, ``config`` or a count) for a process among ``processes`` on the node."""
    if setting == "auto":
        return auto_workers(processes)
    if setting == "config":
        return int(config["Train"]["loader"]["num_workers"])
    try:
        count = int(setting)
    except ValueError:
        count = -1
    if count < 0:
        raise ConfigError(f"--workers must be 'auto', 'config' or a count >= 0, got {setting!r}")
    return count


def with_workers(config: Mapping[str, Any], workers: Optional[int]) -> Dict[str, Any]:
    """``config`` with ``workers`` Train loader workers (unchanged when None)."""
    config = dict(config)
    if workers is not None:
        config["Train"] = dict(config["Train"], loader=dict(config["Train"]["loader"], num_workers=workers))
    return config
