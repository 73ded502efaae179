"""One run per output folder: a lock on ``save_model_dir`` and no silent overwrite of another run.

``claim_run_dir(config, env)`` is what ``build_trainer`` (and ``tools/train.py``, earlier: before its
log file) calls before anything is written there, whatever starts the run: rank 0
takes ``save_model_dir/.ppdist.lock`` (its holder's host, pid and torchrun job), refuses a folder
that holds another run's checkpoints unless this run resumes (``Global.checkpoints``) or is told to
replace it (``Global.overwrite: true``), and every rank gets the same verdict. A lock left by a
process that no longer exists on this host, or by an earlier attempt of the same torchrun job, is
taken over; the lock is removed when the run's training ends (``RunDirRelease``) or the process exits. A
folder this process has claimed already is not claimed again (the first claim releases it).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import time
from typing import Any, Dict, Mapping, Optional, Set

from ppdist.engine.dist import DistEnv, broadcast_object
from ppdist.errors import ConfigError
from ppdist.utils.atomic import write_text_atomic

logger = logging.getLogger("ppdist")
LOCK_NAME = ".ppdist.lock"
RUN_FILES = ("latest.pt", "best_accuracy.pt")


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


def _read_holder(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as handle:
            holder = json.load(handle)
        return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
        return None


def _stale(holder: Optional[Mapping[str, Any]]) -> bool:
    """A lock nobody holds any more: unreadable, a dead process of this host, or an earlier
    attempt of this torchrun job (a restart)."""
    if holder is None:
        return True
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    if job and holder.get("job") == job:
        return True
    return holder.get("host") == socket.gethostname() and not _alive(int(holder.get("pid", -1)))


class RunDirLock:
    """The lock file of an output folder, held by this process until ``release``."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, LOCK_NAME)
        self.held = False

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        holder = _holder()
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            other = _read_holder(self.path)
            if not _stale(other):
                raise ConfigError(
                    f"Global.save_model_dir {os.path.dirname(self.path)} is in use by another run (host "
                    f"{other.get('host')}, pid {other.get('pid')}, since {other.get('started')}); give this run "
                    f"another save_model_dir, or delete {self.path} if that run is gone"
                ) from None
            logger.warning("taking over the lock of a run that has ended: %s (%s)", self.path, other)
            write_text_atomic(self.path, json.dumps(holder))
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(holder, handle)
        self.held = True
        atexit.register(self.release)

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        holder = _read_holder(self.path)
        if (
            holder is not None
            and holder.get("pid") == os.getpid()
            and holder.get("host") == socket.gethostname()
        ):
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)


def existing_run_files(folder: str) -> list:
    return [name for name in RUN_FILES if os.path.exists(os.path.join(folder, name))]


def overwrite_problem(glob: Mapping[str, Any]) -> Optional[str]:
    """Why starting this run in ``save_model_dir`` would replace another run's checkpoints (None if not)."""
    folder = glob["save_model_dir"]
    found = existing_run_files(folder)
    resuming = (
        bool(glob.get("checkpoints")) or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    )
    if not found or resuming or glob.get("overwrite"):
        return None
    return (
        f"Global.save_model_dir {folder} already holds a run's checkpoints ({', '.join(found)}); continue "
        f"it with -o Global.checkpoints=auto, give this run another save_model_dir, or replace it with "
        f"-o Global.overwrite=true"
    )


class RunDirClaim:
    """This process's claim on an output folder (every rank has one; rank 0's holds the lock)."""

    def __init__(self, folder: str, lock: Optional[RunDirLock], first: bool) -> None:
        self.folder, self.lock, self.first = folder, lock, first

    def release(self) -> None:
        """Give the folder back (only the claim that took it does)."""
        if not self.first:
            return
        self.first = False
        _CLAIMED.discard(self.folder)
        if self.lock is not None:
            self.lock.release()


_CLAIMED: Set[str] = set()  # output folders this process has claimed and not given back


def claim_run_dir(config: Mapping[str, Any], env: DistEnv) -> RunDirClaim:
    """Rank 0 locks ``save_model_dir`` and checks it may write there; every rank raises the same
    ``ConfigError`` when it may not. A folder this process claimed already: nothing to check
    again (every rank of a run takes the same path here)."""
    glob = config["Global"]
    folder = os.path.abspath(glob["save_model_dir"])
    if folder in _CLAIMED:
        return RunDirClaim(folder, None, first=False)
    lock: Optional[RunDirLock] = None
    problem: Optional[str] = None
    if env.is_main:
        problem = overwrite_problem(glob)
        if problem is None:
            lock = RunDirLock(glob["save_model_dir"])
            try:
                lock.acquire()
            except ConfigError as exc:
                problem = str(exc)
    problem = broadcast_object(problem, env)
    if problem is not None:
        raise ConfigError(problem)
    _CLAIMED.add(folder)
    return RunDirClaim(folder, lock, first=True)
