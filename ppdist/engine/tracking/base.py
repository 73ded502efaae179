"""The sink interface, and the guard that keeps a failing sink from stopping a training run.

A sink receives what ``trainer.writer`` is given — ``log_scalars(prefix, values, step)`` with the
log hook's ``train`` values and the evaluation's ``eval`` metrics, ``log_checkpoint(name, path,
step)`` after each checkpoint rank 0 writes — and ``close()`` once at the end of training.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Mapping, Optional

logger = logging.getLogger("ppdist")
RETRY_AFTER_S = 300.0  # a sink that failed is left alone this long before it is tried again


def numeric_values(values: Mapping[str, Any]) -> Dict[str, float]:
    """The plain numbers of ``values`` as floats (per-class lists and the like are left out)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class Sink:
    """Base class: a destination of the training's scalars and checkpoints. ``run_id`` names the
    tracker's run (kept in checkpoints so that a resumed training continues it)."""

    label = "sink"
    run_id: Optional[str] = None

    def log_scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        """``values`` (floats) as ``<prefix>/<key>`` at global step ``step``."""

    def log_checkpoint(self, name: str, path: str, step: int) -> None:
        """The checkpoint ``name`` just written to ``path`` at global step ``step``."""

    def close(self) -> None:
        """End the run (once, after the last value)."""


class GuardedSink:
    """Calls ``sink`` and never lets its failure reach the training: the first failure is
    logged as a warning, the sink is then left alone for ``retry_after_s`` (the values of that
    time are dropped and counted) and tried again; a recovery and the count of dropped calls are
    logged. A sink that cannot start raises before training instead (the tracker hooks)."""

    def __init__(
        self,
        sink: Sink,
        retry_after_s: float = RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink, self.retry_after_s, self.clock = sink, retry_after_s, clock
        self.resume_at: Optional[float] = None  # set while failing: when to try again
        self.dropped = 0

    def log_scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        self._call("log_scalars", prefix, values, step)

    def log_checkpoint(self, name: str, path: str, step: int) -> None:
        self._call("log_checkpoint", name, path, step)

    def close(self) -> None:
        self.resume_at = None  # the last chance: ending the run
        self._call("close")
        if self.dropped:
            logger.warning(
                "%s: %d logging call(s) failed or were dropped in this run", self.sink.label, self.dropped
            )

    def _call(self, method: str, *args: Any) -> None:
        now = self.clock()
        if self.resume_at is not None and now < self.resume_at:
            self.dropped += 1
            return
        try:
            getattr(self.sink, method)(*args)
        except Exception as exc:  # a tracker's failure, whatever it is, must not end the training
            self.dropped += 1
            if self.resume_at is None:
                logger.warning(
                    "%s: %s failed (%s: %s); training goes on (the log file and the other sinks are "
                    "not affected), next try in %.0f s",
                    self.sink.label,
                    method,
                    type(exc).__name__,
                    exc,
                    self.retry_after_s,
                )
            self.resume_at = now + self.retry_after_s
            return
        if self.resume_at is not None:
            logger.info("%s: logging works again (%d call(s) dropped so far)", self.sink.label, self.dropped)
            self.resume_at = None
