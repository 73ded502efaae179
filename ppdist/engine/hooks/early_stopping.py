"""The early-stopping hook: ends the run when the main indicator stops improving."""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, Mapping, Optional

from ppdist.engine.hooks.base import PRIORITY_EARLY_STOP, Hook
from ppdist.engine.hooks.evaluation import Evaluation

logger = logging.getLogger("ppdist")


class EarlyStopping(Hook):
    """After each evaluation (of the ``evaluation`` hook), counts the evaluations since the main
    indicator last rose by more than ``min_delta`` above its best; at ``patience`` it asks the
    trainer to stop (``Trainer.request_stop``: final checkpoint as at the schedule's end). Every
    process sees the same metrics, so all decide alike. State: the best value, the count, the
    step last judged and whether the run stopped. A resumed stopped run trains on when
    ``patience`` was raised above the evaluations it had without improvement (as if the new
    patience had been set from the start), else it stops at once and says how to go on."""

    name = "early_stop"
    priority = PRIORITY_EARLY_STOP

    def __init__(self, patience: int, min_delta: float = 0.0) -> None:
        if patience < 1 or min_delta < 0:
            raise ValueError(f"patience must be >= 1 and min_delta >= 0, got {patience}, {min_delta}")
        self.patience, self.min_delta = int(patience), float(min_delta)
        self.best: Optional[float] = None
        self.bad_evaluations = 0
        self.judged_step = -1
        self.stopped = False

    def before_train(self) -> None:
        if not self.stopped:
            return
        if self.bad_evaluations < self.patience:
            self.stopped = False
            logger.info(
                "the resumed run had stopped early after %d evaluation(s) without improvement; "
                "Global.early_stop.patience is now %d: training continues",
                self.bad_evaluations,
                self.patience,
            )
            return
        self.trainer.request_stop(
            f"{self._reason()}, before this resume; raise Global.early_stop.patience above "
            f"{self.bad_evaluations} to train on"
        )

    def after_step(self) -> None:
        self._judge()

    def after_epoch(self) -> None:
        self._judge()

    def _judge(self) -> None:
        evaluation = self.trainer.hook(Evaluation.name)
        assert isinstance(evaluation, Evaluation)
        step = evaluation.last_eval_step
        if step == self.judged_step or not evaluation.last_metrics:
            return
        self.judged_step = step
        value = float(evaluation.last_metrics[evaluation.main_indicator])
        if math.isnan(value):  # nothing was evaluated: neither better nor worse
            return
        if self.best is None or value > self.best + self.min_delta:
            self.best, self.bad_evaluations = value, 0
            return
        self.bad_evaluations += 1
        if self.bad_evaluations >= self.patience and not self.trainer.finished:
            self.stopped = True
            self.trainer.request_stop(self._reason())

    def _reason(self) -> str:
        evaluation = self.trainer.hook(Evaluation.name)
        return (
            f"early stop: {evaluation.main_indicator} has not improved by more than {self.min_delta:g} "
            f"on {self.best} in {self.bad_evaluations} evaluation(s) (Global.early_stop.patience "
            f"{self.patience})"
        )

    def state_dict(self) -> Dict[str, Any]:
        return {
            "best": self.best,
            "bad_evaluations": self.bad_evaluations,
            "judged_step": self.judged_step,
            "stopped": self.stopped,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best = state.get("best")
        self.bad_evaluations = int(state.get("bad_evaluations", 0))
        self.judged_step = int(state.get("judged_step", -1))
        self.stopped = bool(state.get("stopped", False))

    def summary(self) -> Dict[str, Any]:
        return {"early_stopped": True} if self.stopped else {}
