"""The process's random number streams in one place: seeding, capture/restore for checkpoints, and
keeping the CPU streams intact around a block that re-seeds them (per-sample data augmentation).

Only the CPU generators are touched where the name says ``cpu``: ``torch.manual_seed`` would also
(re)seed CUDA's generators, which nothing restores afterwards and which, in a CUDA build, costs a
stack capture on every call.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Dict, Iterator, Mapping

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python ``random``, numpy and torch (CPU and CUDA) with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_cpu_rngs(seed: int) -> None:
    """Seed python ``random``, numpy and torch's CPU generator (not CUDA's) with ``seed``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)


@contextlib.contextmanager
def kept_cpu_rng_streams() -> Iterator[None]:
    """Restore python ``random``, numpy and torch's CPU generator to their states at the start of the
    block when it ends, whatever it did to them."""
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


def capture_rng_state() -> Dict[str, Any]:
    """This process's torch / CUDA / numpy / python RNG states as weights_only-safe values."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state: Dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [
            np_state[0],
            torch.from_numpy(np_state[1].astype(np.int64)),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of ``capture_rng_state``."""
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
