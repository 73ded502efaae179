"""The lock file of an output folder (``save_model_dir/.ppdist.lock``): its holder's host, pid and
torchrun job, written whole before it appears (a temporary file hard-linked into place, so no
reader ever sees an empty lock; on a filesystem without hard links it is created with ``O_EXCL``
and then written).

A lock nobody holds any more (unreadable, a process of this host that has ended, or an earlier
attempt of this torchrun job) is taken over, and judging it stale and replacing it is one step:
it happens under ``.ppdist.lock.takeover`` (created with ``O_EXCL``), so of several processes that
find the same stale lock exactly one takes it and the others see the new holder. Every failure
to create the folder or write the lock (read-only, a file in the way, a full disk) is one
``ConfigError`` line, and no lock or temporary file is left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import secrets
import socket
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from ppdist.errors import ConfigError
from ppdist.utils import strict_json

LOCK_NAME = ".ppdist.lock"
TAKEOVER_SUFFIX = ".takeover"
TAKEOVER_WAIT_S = 10.0


def _holder() -> Dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "job": os.environ.get("TORCHELASTIC_RUN_ID"),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _pid(holder: Mapping[str, Any]) -> Optional[int]:
    """The holder's pid, None when it is not a positive whole number (text, null, a float...)."""
    pid = holder.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def _read_holder(path: str) -> Tuple[Optional[Dict[str, Any]], Optional[int]]:
    """``(holder or None when unreadable, inode or None when the file is gone)``."""
    try:
        with open(path, encoding="utf-8") as handle:
            inode = os.fstat(handle.fileno()).st_ino
            try:
                holder = json.load(handle)
            except ValueError:
                return None, inode
    except OSError:
        return None, None
    return (holder if isinstance(holder, dict) else None), inode


def _stale(holder: Optional[Mapping[str, Any]]) -> bool:
    """A lock nobody holds any more: unreadable, a process of this host that has ended (or a pid no
    process can have), or an earlier attempt of this torchrun job (a restart)."""
    if holder is None:
        return True
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    if job and holder.get("job") == job:
        return True
    if holder.get("host") != socket.gethostname():
        return False  # another machine's process: cannot be judged from here
    pid = _pid(holder)
    return pid is None or not _alive(pid)


def _describe(holder: Optional[Mapping[str, Any]]) -> str:
    """``host H, pid P, since T`` (``unreadable`` for a lock that is not a holder's record)."""
    if holder is None:
        return "unreadable"
    return f"host {holder.get('host')}, pid {holder.get('pid')}, since {holder.get('started')}"


def _create(path: str) -> int:
    return os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)


def _fill(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_new(path: str, data: bytes) -> None:
    """Create ``path`` (it must not exist) holding ``data``; removed again if the write fails."""
    fd = _create(path)
    try:
        _fill(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.remove(path)
        raise
    os.close(fd)


def _place(tmp: str, path: str) -> None:
    """Make ``path`` a copy of the complete file ``tmp``, failing with ``FileExistsError`` if it exists:
    a hard link (atomic); where the filesystem has none, an ``O_EXCL`` file written after it appears."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV):
            raise
        with open(tmp, "rb") as handle:
            _write_new(path, handle.read())


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


class RunDirLock:
    """The lock file of an output folder, held by this process until ``release``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.path = os.path.join(folder, LOCK_NAME)
        self.held = False
        self.notes: List[str] = []  # what taking the lock did, logged by the claim once the log is open

    def acquire(self) -> None:
        """Take the lock, or raise ``ConfigError`` (in use by a live run; the folder cannot be written)."""
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create Global.save_model_dir {self.folder}: {_reason(exc)}") from None
        tmp = f"{self.path}.{secrets.token_hex(6)}.tmp"
        try:
            _write_new(tmp, strict_json.dumps(_holder()).encode("utf-8"))
        except OSError as exc:
            raise ConfigError(
                f"cannot write the lock file {self.path} in Global.save_model_dir: {_reason(exc)}; "
                f"give this run a writable save_model_dir"
            ) from None
        try:
            self._link_or_take_over(tmp)
        finally:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        self.held = True
        atexit.register(self.release)

    def _link_or_take_over(self, tmp: str) -> None:
        while True:
            try:
                _place(tmp, self.path)
                return
            except FileExistsError:
                pass
            except OSError as exc:
                raise ConfigError(f"cannot create the lock file {self.path}: {_reason(exc)}") from None
            try:
                if self._take_over_if_stale(tmp):
                    return
            except OSError as exc:
                raise ConfigError(f"cannot replace the lock file {self.path}: {_reason(exc)}") from None

    def _take_over_if_stale(self, tmp: str) -> bool:
        """Under the takeover file: a stale lock is replaced by ``tmp`` (True); False when the
        folder changed meanwhile (try again); a live holder's lock raises ``ConfigError``."""
        with self._takeover():
            holder, inode = _read_holder(self.path)
            if inode is None:
                return False  # released meanwhile
            if not _stale(holder):
                raise self._in_use(holder or {})
            aside = f"{self.path}.{secrets.token_hex(6)}.stale"
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                return False
            if os.stat(aside).st_ino != inode:  # replaced since it was read: put it back, judge again
                with contextlib.suppress(FileExistsError):
                    os.link(aside, self.path)
                os.remove(aside)
                return False
            os.remove(aside)
            self.notes.append(
                f"took over the lock of a run that has ended: {self.path} ({_describe(holder)})"
            )
            try:
                _place(tmp, self.path)
            except FileExistsError:
                return False  # a process that found no lock took it first: judge its lock
            return True

    @contextlib.contextmanager
    def _takeover(self) -> Iterator[None]:
        """Only one process at a time judges and replaces a lock."""
        path = self.path + TAKEOVER_SUFFIX
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        while True:
            try:
                _write_new(path, str(os.getpid()).encode("ascii"))
                break
            except FileExistsError:
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"{path} has been there for over {TAKEOVER_WAIT_S:.0f} s (a process stopped while "
                        f"taking over {self.path}?); delete it if no run is starting in this folder"
                    ) from None
                time.sleep(0.01)
            except OSError as exc:
                raise ConfigError(f"cannot create {path}: {_reason(exc)}") from None
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.remove(path)

    def _in_use(self, other: Mapping[str, Any]) -> ConfigError:
        return ConfigError(
            f"Global.save_model_dir {self.folder} is in use by another run ({_describe(other)}); give "
            f"this run another save_model_dir, or delete {self.path} if that run is gone"
        )

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        holder, _ = _read_holder(self.path)
        if (
            holder is not None
            and holder.get("pid") == os.getpid()
            and holder.get("host") == socket.gethostname()
        ):
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
