"""Checkpoint files written off the training step's path: a host copy of the state, then a thread.

``BackgroundWriter.submit`` waits for the previous write (at most one write, and one host copy,
in flight), copies the state to host memory (``HostCopier``: the only part the step pays) and
starts a thread that writes each file atomically (``io.save_atomic``: a unique temporary file
beside it, fsync, ``os.replace``, fsync of the folder). What the caller does once the files are
whole (a log line, the trackers, deleting old snapshots) runs on the caller's thread when it next
looks: ``poll`` (every step), ``wait`` (the next save, the end of training). A failed write is a
``CheckpointError`` naming the file, raised there; a write still running when the interpreter
exits is waited for (the thread is not a daemon) and its error logged.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch

from ppdist.engine.checkpoint.host_copy import HostCopier
from ppdist.engine.checkpoint.io import save_atomic
from ppdist.errors import CheckpointError

logger = logging.getLogger("ppdist")
THREAD_NAME = "ppdist-checkpoint-writer"


@dataclass
class _Job:
    """One submitted state and the files it goes to."""

    state: Optional[Dict[str, Any]]
    paths: List[str]
    ready: List[torch.cuda.Event]
    label: str
    on_written: Optional[Callable[[], None]]
    thread: Optional[threading.Thread] = None
    error: Optional[CheckpointError] = None


class BackgroundWriter:
    """Writes checkpoint states to files in a background thread, one job at a time.

    ``write(state, path)`` writes one file (``save_atomic``; tests put a slow or failing one in its
    place). ``background`` False (``Global.checkpoint_in_background``): ``submit`` waits for its
    own job, so its error is raised and ``on_written`` run before it returns.
    """

    def __init__(
        self, write: Callable[[Mapping[str, Any], str], None] = save_atomic, background: bool = True
    ) -> None:
        self.write = write
        self.background = background  # False: submit returns once the files are whole
        self._copier = HostCopier()
        self._job: Optional[_Job] = None
        _WRITERS.add(self)

    @property
    def pending(self) -> bool:
        """A job was submitted and its outcome not yet taken (``poll`` / ``wait``)."""
        return self._job is not None

    def submit(
        self,
        state: Mapping[str, Any],
        paths: Sequence[str],
        label: str = "",
        on_written: Optional[Callable[[], None]] = None,
    ) -> None:
        """Write ``state`` to each of ``paths`` in the background, after the previous job (whose
        error is raised here). ``on_written`` runs on a later ``poll`` / ``wait`` once every file
        is whole; ``label`` (e.g. ``global_step 12``) goes into an error's message."""
        self.wait()
        host_state, ready = self._copier.copy(dict(state))
        job = _Job(host_state, list(paths), ready, label, on_written)
        job.thread = threading.Thread(target=self._run, args=(job,), name=THREAD_NAME)
        self._job = job
        job.thread.start()
        if not self.background:
            self.wait()

    def poll(self) -> None:
        """Take the outcome of a job that has ended (raise its error, or run ``on_written``);
        nothing while it is still writing."""
        job = self._job
        if job is not None and job.thread is not None and not job.thread.is_alive():
            self._finish()

    def wait(self, raise_error: bool = True) -> None:
        """Wait for the job in flight, then take its outcome: run ``on_written``, or raise its
        error (with ``raise_error`` False log it instead: a run that is failing already)."""
        job = self._job
        if job is None:
            return
        if job.thread is not None:
            job.thread.join()
        try:
            self._finish()
        except CheckpointError as exc:
            if raise_error:
                raise
            logger.error("%s", exc)

    def close(self, raise_error: bool = True) -> None:
        """``wait``, then give the pinned host buffers back."""
        try:
            self.wait(raise_error)
        finally:
            self._copier.clear()

    def _finish(self) -> None:
        job, self._job = self._job, None
        assert job is not None
        if job.error is not None:
            raise job.error
        if job.on_written is not None:
            job.on_written()

    def _run(self, job: _Job) -> None:
        """The thread: wait for the device copies, write each file, drop the host copy."""
        path = job.paths[0]
        try:
            for event in job.ready:
                event.synchronize()
            for path in job.paths:
                self.write(job.state or {}, path)
        except CheckpointError as exc:
            job.error = CheckpointError(f"{exc} (written in the background{_at(job.label)})")
        except Exception as exc:  # the thread must hand every failure to the training loop
            reason = (str(exc).splitlines() or [""])[0]
            job.error = CheckpointError(
                f"cannot write checkpoint {path}{_at(job.label)}: {type(exc).__name__}: {reason}"
            )
        finally:
            job.state = None


def _at(label: str) -> str:
    return f", the state of {label}" if label else ""


_WRITERS: "weakref.WeakSet[BackgroundWriter]" = weakref.WeakSet()


@atexit.register
def _finish_at_exit() -> None:
    """A job nobody waited for (a script that saved and returned): its error, logged at exit."""
    for writer in list(_WRITERS):
        writer.close(raise_error=False)
