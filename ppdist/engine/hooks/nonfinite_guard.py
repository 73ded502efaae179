"""The non-finite guard hook: stops a diverged run, or reports the steps it skipped."""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping

from ppdist.engine.hooks.base import PRIORITY_NONFINITE, Hook, ends_window

logger = logging.getLogger("ppdist")


class NonFiniteGuard(Hook):
    """Reads the trainer's non-finite record (``ppdist.engine.nonfinite``) every ``period`` steps
    and at the end of each epoch — after the log line, before evaluation and checkpoints — and
    stops the run with ``NonFiniteError`` when a step was not finite (``nan_policy: stop``;
    ``Trainer.save`` and the evaluation check too). With ``nan_policy: skip`` it warns with the
    number of steps left out since the last report. State: the total skipped."""

    name = "nonfinite"
    priority = PRIORITY_NONFINITE

    def __init__(self, period: int = 10) -> None:
        self.period = int(period)
        self.reported = 0

    def after_step(self) -> None:
        if ends_window(self.trainer, self.period):
            self._check()

    def after_epoch(self) -> None:
        self._check()

    def _check(self) -> None:
        trainer = self.trainer
        watch = trainer.nonfinite
        if watch is None:
            return
        trainer.check_finite()
        skipped = watch.skipped  # read on the host here only (the count stays on the device)
        if skipped > self.reported:
            logger.warning(
                "Global.nan_policy skip: %d step(s) with a non-finite loss or gradient left out up to "
                "global_step %d (%d in this run)",
                skipped - self.reported,
                trainer.position.global_step,
                skipped,
            )
            self.reported = skipped

    def state_dict(self) -> Dict[str, Any]:
        watch = self.trainer.nonfinite
        return {"skipped": watch.skipped if watch is not None else 0}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.reported = int(state.get("skipped", 0))
        if self.trainer.nonfinite is not None:
            self.trainer.nonfinite.skipped = self.reported

    def summary(self) -> Dict[str, Any]:
        watch = self.trainer.nonfinite
        skipped = watch.skipped if watch is not None else 0
        return {"skipped_steps": skipped} if skipped else {}
