"""Process memory: what this process holds, and handing freed heap pages back to the system."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Dict, Optional


@functools.lru_cache(maxsize=1)
def _libc() -> Optional[ctypes.CDLL]:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_free_memory() -> None:
    """Return the heap's free pages to the system (glibc ``malloc_trim``; a no-op elsewhere).

    Building an index frees hundreds of MB of temporaries that glibc would otherwise keep
    mapped in the process, counted in its resident size for the rest of the run."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def memory_kib(pid: str = "self") -> Dict[str, int]:
    """``/proc/<pid>/smaps_rollup`` fields in KiB (Rss, Pss, Shared_*, Private_*, ...); Linux only."""
    out: Dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1])
    return out
