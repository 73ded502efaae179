"""One run per output folder: a lock on ``save_model_dir`` and no silent overwrite of another run.

``claim_run_dir(config, env)`` is what ``build_trainer`` (and ``tools/train.py``, earlier: before its
log file) calls before anything is written there, whatever starts the run: rank 0
takes ``save_model_dir/.ppdist.lock`` (``run_lock.RunDirLock``), refuses a folder that holds another
run's checkpoints unless this run resumes the folder's own checkpoints (``Global.checkpoints: auto``
with a ``latest.pt``, or a file inside the folder) or is told to replace that run
(``Global.overwrite: true``: the replaced run's files are deleted first,
``run_files.remove_run_artifacts``, so its log, events and curves do not mix with the new run's),
and every rank gets the same verdict. The lock is removed when the run's training ends
(``RunDirRelease``) or the process exits. A folder this process has claimed already is not claimed
again (the first claim releases it).
"""

from __future__ import annotations

import logging
import os
from typing import Any, List, Mapping, Optional, Set, Tuple

from ppdist.engine.dist import DistEnv, broadcast_object
from ppdist.engine.run_files import describe, existing_run_files, remove_run_artifacts
from ppdist.engine.run_lock import LOCK_NAME, RunDirLock
from ppdist.errors import ConfigError

__all__ = ["LOCK_NAME", "RunDirClaim", "RunDirLock", "claim_run_dir", "overwrite_problem"]

logger = logging.getLogger("ppdist")


def _restarted() -> bool:
    """A torchrun restart of a job: the same run continues (its first attempt wrote the folder)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def resumes_own_run(glob: Mapping[str, Any]) -> bool:
    """``Global.checkpoints`` continues the run of ``save_model_dir`` itself: ``auto``, or a
    checkpoint file inside that folder."""
    setting = glob.get("checkpoints")
    if not setting:
        return False
    return setting == "auto" or _inside(str(setting), glob["save_model_dir"])


def continues_in_place(glob: Mapping[str, Any]) -> bool:
    """This run continues the folder's own run from a checkpoint there (``auto`` with a
    ``latest.pt``, or a file inside the folder): ``Global.overwrite`` then has nothing to replace."""
    if glob.get("checkpoints") == "auto":
        return "latest.pt" in existing_run_files(glob["save_model_dir"])
    return resumes_own_run(glob)


def best_kept(found: List[str]) -> str:
    """The checkpoint to name when ``auto`` finds no ``latest.pt``: ``best_accuracy.pt``, else the
    newest snapshot."""
    return "best_accuracy.pt" if "best_accuracy.pt" in found else found[-1]


def overwrite_problem(glob: Mapping[str, Any]) -> Optional[str]:
    """Why starting this run in ``save_model_dir`` would replace another run's checkpoints (None if not)."""
    folder = glob["save_model_dir"]
    found = existing_run_files(folder)
    if not found or glob.get("overwrite") or _restarted():
        return None
    held = f"Global.save_model_dir {folder} already holds a run's checkpoints ({describe(found)})"
    setting = glob.get("checkpoints")
    if setting == "auto" and "latest.pt" not in found:
        return (
            f"{held} but no latest.pt, so Global.checkpoints=auto has nothing to continue and would "
            f"replace them; resume one explicitly with -o Global.checkpoints="
            f"{os.path.join(folder, os.path.splitext(best_kept(found))[0])}, give this run another "
            f"save_model_dir, or replace it with -o Global.overwrite=true"
        )
    if resumes_own_run(glob):
        return None
    if setting:
        return (
            f"{held} and Global.checkpoints {setting} is another run's checkpoint: resuming it here "
            f"would replace them; resume it in its own folder or a new save_model_dir, or replace "
            f"{folder}'s run with -o Global.overwrite=true"
        )
    return (
        f"{held}; continue it with -o Global.checkpoints=auto, give this run another save_model_dir, "
        f"or replace it with -o Global.overwrite=true"
    )


def check_folder(folder: str) -> None:
    """``save_model_dir`` names a folder that can be created: not empty, not a file."""
    if not str(folder).strip():
        raise ConfigError(
            "Global.save_model_dir is empty: give the folder for this run's checkpoints and logs"
        )
    path = os.path.abspath(folder)
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    if path and not os.path.isdir(path):
        raise ConfigError(f"Global.save_model_dir {folder}: {path} is a file, not a folder; give a folder")


def clear_replaced_run(glob: Mapping[str, Any]) -> List[str]:
    """With ``Global.overwrite`` (not continuing the folder's run, not a torchrun restart): delete
    the replaced run's artifacts; returns their names."""
    if not glob.get("overwrite") or continues_in_place(glob) or _restarted():
        return []
    folder = glob["save_model_dir"]
    try:
        return remove_run_artifacts(folder)
    except OSError as exc:
        raise ConfigError(
            f"Global.overwrite: cannot remove the replaced run's files from {folder}: {exc}"
        ) from None


class RunDirClaim:
    """This process's claim on an output folder (every rank has one; rank 0's holds the lock).
    ``removed``: what ``Global.overwrite`` deleted of the replaced run (rank 0), to be logged once
    the log file is open (``report``)."""

    def __init__(self, folder: str, lock: Optional[RunDirLock], first: bool, removed: List[str]) -> None:
        self.folder, self.lock, self.first, self.removed = folder, lock, first, removed

    def report(self) -> None:
        """Log (once) what claiming the folder did: a stale lock taken over, what the overwrite removed."""
        for note in self.lock.notes if self.lock is not None else []:
            logger.warning("%s", note)
        if self.lock is not None:
            self.lock.notes = []
        if self.removed:
            logger.info(
                "Global.overwrite: removed the replaced run's %s from %s",
                ", ".join(self.removed),
                self.folder,
            )
            self.removed = []

    def release(self) -> None:
        """Give the folder back (only the claim that took it does)."""
        if not self.first:
            return
        self.first = False
        _CLAIMED.discard(self.folder)
        if self.lock is not None:
            self.lock.release()


_CLAIMED: Set[str] = set()  # output folders this process has claimed and not given back


def _claim_on_main(glob: Mapping[str, Any]) -> Tuple[Optional[RunDirLock], List[str], Optional[str]]:
    """Rank 0's part: ``(lock, removed, problem)``."""
    try:
        check_folder(glob["save_model_dir"])
        problem = overwrite_problem(glob)
        if problem is not None:
            return None, [], problem
        lock = RunDirLock(glob["save_model_dir"])
        lock.acquire()
    except ConfigError as exc:
        return None, [], str(exc)
    try:
        removed = clear_replaced_run(glob)
    except ConfigError as exc:
        lock.release()
        return None, [], str(exc)
    return lock, removed, None


def claim_run_dir(config: Mapping[str, Any], env: DistEnv) -> RunDirClaim:
    """Rank 0 locks ``save_model_dir`` and checks it may write there; every rank raises the same
    ``ConfigError`` when it may not. A folder this process claimed already: nothing to check
    again (every rank of a run takes the same path here)."""
    glob = config["Global"]
    folder = os.path.abspath(glob["save_model_dir"]) if str(glob["save_model_dir"]).strip() else ""
    if folder and folder in _CLAIMED:
        return RunDirClaim(folder, None, first=False, removed=[])
    lock: Optional[RunDirLock] = None
    removed: List[str] = []
    problem: Optional[str] = None
    if env.is_main:
        lock, removed, problem = _claim_on_main(glob)
    problem = broadcast_object(problem, env)
    if problem is not None:
        raise ConfigError(problem)
    _CLAIMED.add(folder)
    return RunDirClaim(folder, lock, first=True, removed=removed)
