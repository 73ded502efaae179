"""Build a dataset index once per node and map it everywhere else (``dataset.cache``).

``cache: auto`` keeps index files in ``$PPDIST_CACHE_DIR`` (default ``~/.cache/ppdist/index``),
``cache: PATH`` in the folder ``PATH``, ``cache: off`` builds in memory in every process. A cache
file is named after the input files' paths and the dataset options, and holds a key of the
inputs' size, modification and change times and inode: a changed input is rebuilt (replacing the
stale file) — also one edited in place with its mtime restored (its ctime moved) or replaced by
another file (another inode) — an unchanged one is mapped — by the other ranks of the node, by the
next run, by a torchrun restart. A cache file that fails its checksum or cannot be parsed is
rebuilt with one warning.

The first process to need an index takes an exclusive lock on ``<file>.lock``, builds, writes the
file atomically and maps it; processes that wait on the lock then find the file and map it. A
builder that dies releases the lock (the kernel drops it), so nobody waits for a dead process.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import time
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence

from ppdist.data.packed import IndexFileError, PackedIndex
from ppdist.errors import ConfigError
from ppdist.utils import strict_json
from ppdist.utils.memory import release_free_memory

logger = logging.getLogger("ppdist")

FORMAT_VERSION = 2
CACHE_DIR_ENV = "PPDIST_CACHE_DIR"
WAIT_REPORT_S = 30.0


def default_cache_dir() -> str:
    """``$PPDIST_CACHE_DIR``, else ``$XDG_CACHE_HOME/ppdist/index``, else ``~/.cache/ppdist/index``."""
    if os.environ.get(CACHE_DIR_ENV):
        return os.environ[CACHE_DIR_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ppdist", "index")


def cache_folder(cache: Any, key: str) -> Optional[str]:
    """The folder index files go to for the setting ``cache`` (``None``: off); ``key`` names it in errors."""
    if cache is None or cache is False:
        return None
    if not isinstance(cache, str) or not cache.strip():
        raise ConfigError(f"{key} must be 'auto', 'off' or a folder path, got {cache!r}")
    if cache.strip().lower() == "off":
        return None
    if cache.strip().lower() == "auto":
        return default_cache_dir()
    return os.path.abspath(os.path.expanduser(cache))


def source_stamp(paths: Sequence[str]) -> list:
    """``[absolute path, size, mtime_ns, ctime_ns, inode]`` of each input: what makes a
    cache file stale (ctime moves on any write, even one whose mtime is set back afterwards)."""
    stamp = []
    for path in paths:
        st = os.stat(path)
        stamp.append([os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
    return stamp


def cache_file(folder: str, kind: str, sources: Sequence[str], options: Mapping[str, Any]) -> str:
    """``<folder>/<kind>-<hash of the inputs' paths and the options>.idx``."""
    ident = strict_json.dumps(
        {"kind": kind, "sources": [os.path.abspath(p) for p in sources], "options": options},
        sort_keys=True,
        default=str,
    )
    return os.path.join(folder, f"{kind}-{hashlib.sha256(ident.encode()).hexdigest()[:20]}.idx")


def _fresh(path: str, key: Any, report: bool) -> Optional[PackedIndex]:
    """The index in ``path`` if it exists, is intact and was built from exactly ``key``;
    ``report``: log a damaged file (once, by the process that rebuilds it)."""
    try:
        index = PackedIndex.load(path)
    except FileNotFoundError:
        return None
    except (IndexFileError, OSError) as exc:
        if report:
            logger.warning("index cache %s is unreadable (%s); rebuilding it", path, exc)
        return None
    return index if index.key == key else None


@contextlib.contextmanager
def _exclusive(lock_path: str, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path``; report every ``WAIT_REPORT_S`` while another holds it."""
    with open(lock_path, "a+b") as handle:
        start = last = time.monotonic()
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            now = time.monotonic()
            if now - last >= WAIT_REPORT_S:
                logger.info("%s: waiting %.0f s for another process building its index", what, now - start)
                last = now
            time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


BUILDS: Dict[str, int] = {"built": 0, "mapped": 0}  # per process, for tests and the scale benchmark


def _build(build: Callable[[], PackedIndex]) -> PackedIndex:
    """``build()``, then the parser's freed temporaries handed back to the system."""
    BUILDS["built"] += 1
    index = build()
    release_free_memory()
    return index


def cached_index(
    cache: Any,
    cache_key: str,
    kind: str,
    sources: Sequence[str],
    options: Mapping[str, Any],
    build: Callable[[], PackedIndex],
    what: str,
) -> PackedIndex:
    """The index ``build()`` makes from ``sources`` with ``options``, through the cache ``cache``.

    ``cache_key`` is the config key (for messages); ``what`` names the dataset in log lines.
    """
    folder = cache_folder(cache, cache_key)
    if folder is None:
        return _build(build)
    key = {"format": FORMAT_VERSION, "sources": source_stamp(sources), "options": dict(options)}
    key = json.loads(strict_json.dumps(key, sort_keys=True, default=str))  # the form a file holds
    path = cache_file(folder, kind, sources, key["options"])
    index = _fresh(path, key, report=False)  # a damaged file is reported under the lock
    if index is not None:
        BUILDS["mapped"] += 1
        logger.info("%s: index mapped from %s", what, path)
        return index
    stack = contextlib.ExitStack()
    try:
        os.makedirs(folder, exist_ok=True)
        stack.enter_context(_exclusive(path + ".lock", what))
    except OSError as exc:
        logger.warning(
            "%s: index cache folder %s is not writable (%s); building in memory. Set %s to a writable "
            "folder (or %s: off)",
            what,
            folder,
            exc.strerror or exc,
            CACHE_DIR_ENV,
            cache_key,
        )
        return _build(build)
    with stack:
        index = _fresh(path, key, report=True)  # built by the process we waited for
        if index is not None:
            BUILDS["mapped"] += 1
            logger.info("%s: index mapped from %s (built by another process)", what, path)
            return index
        start = time.perf_counter()
        built = _build(build)
        try:
            built.save(path, key)
        except OSError as exc:
            logger.warning("%s: cannot write index cache %s (%s); using it from memory", what, path, exc)
            return built
        logger.info(
            "%s: index built in %.1f s and cached in %s (%.1f MB)",
            what,
            time.perf_counter() - start,
            path,
            os.path.getsize(path) / 2**20,
        )
        del built  # map the file instead: its pages are shared with every other process
        release_free_memory()
        return PackedIndex.load(path)
