"""The evaluation hook: when to evaluate, and the best model so far."""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Dict, Mapping, Optional, Sequence

from ppdist.engine.evaluator import Evaluator
from ppdist.engine.hooks.base import PRIORITY_EVALUATION, Hook
from ppdist.engine.hooks.checkpointing import LATEST_NAME
from ppdist.engine.logger import format_eval_line, format_metrics
from ppdist.errors import EmptyEvaluationError

logger = logging.getLogger("ppdist")
BEST_NAME = "best_accuracy"
PICTURES_DIR = "eval_pictures"  # the final evaluation's pictures, in save_model_dir


class Evaluation(Hook):
    """Evaluates the trainer's eval model (the EMA average when kept) on every process together
    (``Evaluator``: exact unpadded shards) every ``eval_batch_step = [start, interval]`` global
    steps after ``start``, or instead every ``eval_batch_epoch`` epochs at their end; once more
    after the last step (at the last epoch's end, before ``latest`` is written) unless that step
    was just evaluated. A result whose ``main_indicator`` is at least the best so far becomes the
    best and is saved as ``best_accuracy`` (collective); a nan one (nothing was evaluated) never
    does.

    State: the best metrics (with ``best_epoch`` / ``best_step``) and the step last evaluated.
    """

    name = "evaluation"
    priority = PRIORITY_EVALUATION

    def __init__(
        self,
        evaluator: Evaluator,
        main_indicator: str,
        eval_batch_step: Sequence[int] = (0, 2000),
        eval_batch_epoch: Optional[int] = None,
        draw_pictures: bool = True,
    ) -> None:
        self.evaluator = evaluator
        self.draw_final_pictures = draw_pictures  # Global.eval_pictures
        self.main_indicator = main_indicator
        self.start, self.interval = (int(v) for v in eval_batch_step)
        self.every_epochs = eval_batch_epoch
        self.best: Dict[str, Any] = {}
        self.last_eval_step = -1
        self.last_metrics: Dict[str, float] = {}  # of the evaluation at last_eval_step ({}: skipped)

    def after_step(self) -> None:
        if self._due(epoch_end=False):
            self.evaluate(self.trainer.epoch)

    def after_epoch(self) -> None:
        if self._due(epoch_end=True):
            self.evaluate(self.trainer.epoch)
        elif self.trainer.finished and self.last_eval_step != self.trainer.position.global_step:
            # the final model, evaluated before the checkpoint hook writes latest (which then holds it)
            self.evaluate(self.trainer.position.completed_epoch)

    def _due(self, epoch_end: bool) -> bool:
        step = self.trainer.position.global_step
        if self.last_eval_step == step:
            return False
        if self.every_epochs:
            return epoch_end and self.trainer.epoch % self.every_epochs == 0
        return step > self.start and (step - self.start) % self.interval == 0

    def after_train(self) -> None:
        """The final model was evaluated by ``after_epoch`` of the last epoch (before the checkpoint
        hook writes ``latest``, once); should it not have been, evaluate it now and save ``latest``
        again so that it holds the updated best. Then the final evaluation's pictures go to
        ``save_model_dir/eval_pictures`` (rank 0; ``Evaluator.draw_pictures``; off with
        ``Global.eval_pictures: false``)."""
        position = self.trainer.position
        if self.last_eval_step != position.global_step:
            self.evaluate(position.completed_epoch)
            self.trainer.save(LATEST_NAME)
        # the final evaluation's pictures (rank 0)
        if self.draw_final_pictures and self.last_metrics and self.trainer.save_dir:
            try:
                self.evaluator.draw_pictures(os.path.join(self.trainer.save_dir, PICTURES_DIR))
            except Exception as exc:  # the run is done and saved: a picture never fails it
                logger.warning(
                    "the final evaluation's pictures were not drawn: %s: %s", type(exc).__name__, exc
                )

    def evaluate(self, epoch: int) -> Dict[str, float]:
        trainer = self.trainer
        step = trainer.position.global_step
        trainer.check_finite()  # never evaluate (and save as best) weights a non-finite step made
        trainer.sync_buffers()
        trainer.check_state_finite("it is neither evaluated nor saved as the best")
        self.last_metrics = {}
        try:
            metrics = self.evaluator.run(trainer.eval_model(), desc=f"eval step {step}")
        except EmptyEvaluationError as exc:  # no score: never a new best (nor a perfect one)
            self.last_eval_step = step
            logger.warning("eval at step %d skipped: %s; the best model is kept", step, exc)
            return {}
        self.last_eval_step = step
        self.last_metrics = dict(metrics)
        logger.info("%s", format_eval_line(metrics, self.evaluator.last_fps, step))
        trainer.writer.add_scalars("eval", metrics, step)
        current = float(metrics[self.main_indicator])
        if math.isnan(current):  # nothing was evaluated (the evaluator said why): no score, no best
            logger.info("no best from this evaluation (%s is nan)", self.main_indicator)
        elif self.evaluator.last_nonfinite_batches:  # argmax of NaN scores: a number, not a measurement
            logger.warning("eval at step %d: the predictions hold NaN/Inf values: not a best model", step)
        elif not self.best or current >= self.best[self.main_indicator]:
            self.best = dict(metrics, best_epoch=epoch, best_step=step)
            trainer.save(BEST_NAME, {"metrics": metrics})
        logger.info("best metric, %s", format_metrics(self.best))
        return metrics

    def state_dict(self) -> Dict[str, Any]:
        return {"best": dict(self.best), "last_eval_step": self.last_eval_step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best = dict(state.get("best") or {})
        self.last_eval_step = int(state.get("last_eval_step", -1))

    def summary(self) -> Dict[str, Any]:
        return dict(self.best)
