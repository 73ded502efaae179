"""The training-curves hook: ``curves.png`` in ``save_model_dir`` after every evaluation."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Mapping, Optional

from ppdist.engine.hooks.base import PRIORITY_CURVES, Hook
from ppdist.engine.tracking.curves import CurvesSink, series_from_state, series_state
from ppdist.visualize import Series, parse_train_log, rescale_steps, truncate

logger = logging.getLogger("ppdist")


class TrainingCurves(Hook):
    """On rank 0, attaches a ``CurvesSink`` to the trainer's writer: it keeps the same ``train/*``
    and ``eval/*`` values as TensorBoard, in memory, and redraws ``save_model_dir/curves.png``
    (atomically) when evaluation metrics arrive — no file is parsed during training. The values
    go into checkpoints (the hook's state), so a resumed run's picture shows the whole run, in
    another folder too; a checkpoint without them (``Global.plot_curves`` was off) falls back to
    what the run's ``train.log`` holds up to the resume point."""

    name = "curves"
    priority = PRIORITY_CURVES

    def __init__(self) -> None:
        self.sink: Optional[CurvesSink] = None
        self.loaded: Mapping[str, Any] = {}

    def before_train(self) -> None:
        trainer = self.trainer
        if not trainer.env.is_main or not trainer.save_dir:
            return
        self.sink = CurvesSink(trainer.save_dir, self.earlier_history(trainer.position.global_step))
        trainer.writer.add_sink(self.sink)

    def earlier_history(self, global_step: int) -> Series:
        """What a resumed run logged before ``global_step``: from the checkpoint, else from train.log."""
        if not global_step:
            return {}
        if "series" in self.loaded:
            saved_step = int(self.loaded.get("global_step", global_step))
            series = truncate(series_from_state(self.loaded["series"]), saved_step)
            return rescale_steps(series, saved_step, global_step)  # another layout counts other steps
        path = os.path.join(self.trainer.save_dir, "train.log")
        if not os.path.isfile(path):
            return {}
        for handler in logging.getLogger("ppdist").handlers:
            handler.flush()
        return parse_train_log(path, until_step=global_step)

    def state_dict(self) -> Dict[str, Any]:
        if self.sink is None:
            return {}
        return {"global_step": self.trainer.position.global_step, "series": series_state(self.sink.series)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loaded = dict(state)
