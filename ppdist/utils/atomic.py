"""Atomic file writes: a reader sees the old file or the new one, never a partial one.

The content goes to a uniquely named temporary file beside the target (``.<name>.<random>.tmp``),
is flushed to disk (``fsync``), ``os.replace``d over the target, and the folder is flushed too, so
that the new name survives a power cut; on any failure the temporary file is removed and the target
is left as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from typing import IO, Any, Iterator

import torch

TEMP_SUFFIX = ".tmp"


def temporary_path(path: str) -> str:
    """A fresh temporary file name in ``path``'s folder: ``.<name>.<random>.tmp``."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.{secrets.token_hex(6)}{TEMP_SUFFIX}")


@contextlib.contextmanager
def atomic_file(path: str, binary: bool = False) -> Iterator[IO[Any]]:
    """A handle whose content replaces ``path`` when the block ends without an exception.

    The folder is created if needed; text is written as UTF-8.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = temporary_path(path)
    try:
        handle = open(tmp, "xb") if binary else open(tmp, "x", encoding="utf-8")
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:  # also an interrupt: never leave the temporary file behind
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    fsync_folder(os.path.dirname(os.path.abspath(path)))


def fsync_folder(folder: str) -> None:
    """Flush ``folder``'s entries (a rename in it) to disk; a no-op where folders cannot be opened
    (Windows) or synced (some network filesystems refuse with EINVAL)."""
    if os.name != "posix":
        return
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(handle)


def write_text_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_file(path) as handle:
        handle.write(text)


def torch_save_atomic(obj: Any, path: str) -> None:
    """``torch.save(obj)`` to ``path`` atomically."""
    with atomic_file(path, binary=True) as handle:
        torch.save(obj, handle)
