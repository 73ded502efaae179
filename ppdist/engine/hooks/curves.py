"""The training-curves hook: ``curves.png`` in ``save_model_dir`` after every evaluation."""

from __future__ import annotations

import logging

from ppdist.engine.hooks.base import PRIORITY_CURVES, Hook
from ppdist.engine.tracking.curves import CurvesSink, earlier_history

logger = logging.getLogger("ppdist")


class TrainingCurves(Hook):
    """On rank 0, attaches a ``CurvesSink`` to the trainer's writer: it sees the same ``train/*`` and
    ``eval/*`` values as TensorBoard and redraws ``save_model_dir/curves.png`` (atomically) when
    evaluation metrics arrive. A resumed run starts from what its train.log holds up to the
    resume point, so the picture shows the whole run. Drawing failures are the writer's guard's
    business (a warning, never a stopped training)."""

    name = "curves"
    priority = PRIORITY_CURVES

    def before_train(self) -> None:
        trainer = self.trainer
        if not trainer.env.is_main or not trainer.save_dir:
            return
        history = earlier_history(trainer.save_dir, trainer.position.global_step)
        trainer.writer.add_sink(CurvesSink(trainer.save_dir, history))
