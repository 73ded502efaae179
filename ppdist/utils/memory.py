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


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
KEEP_FREED_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit


def keep_freed_memory() -> bool:
    """Let glibc keep freed memory for reuse instead of handing it back at once (a no-op elsewhere).

    Loader workers allocate and free arrays of megabytes per image (decoded images, expanded
    canvases, resized batches). By default glibc maps blocks of that size separately or trims the
    heap after each batch, so every image pays page faults and zeroing again: in the PP-YOLOE
    pipeline about 10% of its CPU time. With blocks up to 32 MiB served from the heap and the heap
    trimmed only past 64 MiB free, a worker reuses its pages (its resident size stays at its peak).
    Returns whether the setting took."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, KEEP_FREED_BYTES)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, 2 * KEEP_FREED_BYTES)
    )


def memory_kib(pid: str = "self") -> Dict[str, int]:
    """``/proc/<pid>/smaps_rollup`` fields in KiB (Rss, Pss, Shared_*, Private_*, ...); Linux only."""
    out: Dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1])
    return out
