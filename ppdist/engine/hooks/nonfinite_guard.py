"""The non-finite guard hook: stops a diverged run, or reports the steps it skipped."""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Tuple

from ppdist.engine.hooks.base import PRIORITY_NONFINITE, Hook, ends_window
from ppdist.engine.nonfinite import NonFiniteError

logger = logging.getLogger("ppdist")


class NonFiniteGuard(Hook):
    """Reads the trainer's non-finite record (``ppdist.engine.nonfinite``) every ``period`` steps
    and at the end of each epoch — after the log line, before evaluation and checkpoints — and
    stops the run with ``NonFiniteError`` when a step was not finite (``nan_policy: stop``;
    ``Trainer.save`` and the evaluation check too). With ``nan_policy: skip`` it warns with the
    number of steps left out since the last report, and stops the run with ``NonFiniteError``
    when more than ``max_ratio`` of the steps were left out: over each window of at least
    ``MIN_WINDOW`` steps since the last judgement, and over the whole run when it ends inside a
    shorter window (before the final evaluation and checkpoint). State: the total skipped."""

    name = "nonfinite"
    priority = PRIORITY_NONFINITE
    MIN_WINDOW = 10  # steps: a shorter window waits for the next check (one bad step is not a share)

    def __init__(self, period: int = 10, max_ratio: float = 0.5) -> None:
        self.period = int(period)
        self.max_ratio = float(max_ratio)
        self.reported = 0
        self.window: Optional[Tuple[int, int]] = None  # (global_step, skipped) where the window began
        self.run_start: Optional[Tuple[int, int]] = None  # the same where this process's run began

    def before_train(self) -> None:
        self.run_start = self.window = (self.trainer.position.global_step, self.reported)

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
        if watch.policy == "skip" and self.window is not None:
            if self._judge(self.window, skipped, minimum=self.MIN_WINDOW):
                self.window = (trainer.position.global_step, skipped)
            elif trainer.finished and self.run_start is not None:  # the run ends inside a short window:
                self._judge(self.run_start, skipped, minimum=1)  # judged as a whole, before the last eval

    def _judge(self, since: Tuple[int, int], skipped: int, minimum: int) -> bool:
        """Raise ``NonFiniteError`` when more than ``max_ratio`` of the steps after ``since``
        (global_step, skipped) were left out; False while they are fewer than ``minimum``."""
        step = self.trainer.position.global_step
        steps, left_out = step - since[0], skipped - since[1]
        if steps < minimum:
            return False
        if left_out / steps > self.max_ratio:
            raise NonFiniteError(
                f"Global.nan_policy skip left out {left_out} of the {steps} steps from global_step "
                f"{since[0] + 1} to {step} ({left_out / steps:.0%} > Global.max_skipped_step_ratio "
                f"{self.max_ratio:g}): the loss, the gradients or the BatchNorm statistics keep being "
                f"non-finite; check the data, lower the learning rate or set Global.grad_clip"
            )
        return True

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
