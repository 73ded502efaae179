"""The bad-sample hook: names every replaced training sample and stops a run that has too many."""

from __future__ import annotations

import logging

from ppdist.engine.dist import all_reduce_sum
from ppdist.engine.hooks.base import PRIORITY_BAD_SAMPLES, Hook, ends_window
from ppdist.errors import DataError

logger = logging.getLogger("ppdist")
BAD_RATIO_MIN_SAMPLES = 200  # judge the bad-sample ratio only past this many samples


class BadSampleCheck(Hook):
    """Warns with the origin of each bad training sample (the dataset replaced it by a neighbour)
    and of each sample a transform changed (e.g. label characters outside the dictionary),
    counts them per epoch over all processes, and raises ``DataError`` when more than
    ``max_ratio`` of the epoch's samples were bad: checked every ``period`` steps (collective:
    the same steps on every process) once ``BAD_RATIO_MIN_SAMPLES`` were seen, and at the end of
    the epoch, which also logs the epoch's count."""

    name = "bad_samples"
    priority = PRIORITY_BAD_SAMPLES

    def __init__(self, max_ratio: float = 0.1, period: int = 10) -> None:
        self.max_ratio = float(max_ratio)
        self.period = int(period)
        self.bad = self.seen = self.changed = 0

    def after_step(self) -> None:
        step = self.trainer.last_step
        for line in step.bad_samples:
            logger.warning("bad training sample replaced: %s", line)
        for line in step.notes:
            logger.warning("training sample changed: %s", line)
        self.bad += len(step.bad_samples)
        self.changed += len(step.notes)
        self.seen += step.local_samples
        if ends_window(self.trainer, self.period):
            self._check(final=False)

    def after_epoch(self) -> None:
        self._check(final=True)
        if self.changed:
            logger.warning(
                "epoch summary: %d training sample(s) of this process were changed (see above)", self.changed
            )
        self.bad = self.seen = self.changed = 0

    def _check(self, final: bool) -> None:
        bad_total, seen_total = (int(v) for v in all_reduce_sum([self.bad, self.seen], self.trainer.env))
        if (
            seen_total
            and (final or seen_total >= BAD_RATIO_MIN_SAMPLES)
            and bad_total / seen_total > self.max_ratio
        ):
            raise DataError(
                f"{bad_total} of {seen_total} training samples this epoch were bad "
                f"({bad_total / seen_total:.1%} > Global.max_bad_sample_ratio {self.max_ratio:.1%}); "
                f"fix the data (see the warnings above) or raise the limit"
            )
        if final and bad_total:
            logger.warning(
                "epoch summary: %d bad training sample(s) of %d were skipped and replaced",
                bad_total,
                seen_total,
            )
