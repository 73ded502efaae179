"""``curves.png``: the run's training curves, redrawn after every evaluation (rank 0)."""

from __future__ import annotations

import os
from typing import Mapping, Optional

from ppdist.engine.tracking.base import Sink
from ppdist.visualize import Series, draw_curves, parse_train_log

CURVES_NAME = "curves.png"


class CurvesSink(Sink):
    """Keeps every scalar the writer logs (``train/*``, ``eval/*``) and draws ``curves.png`` into
    ``save_dir`` each time evaluation metrics arrive. ``history`` seeds it with the earlier part of a
    resumed run (read from its ``train.log``)."""

    label = "curves"

    def __init__(self, save_dir: str, history: Optional[Series] = None) -> None:
        self.path = os.path.join(save_dir, CURVES_NAME)
        self.series: Series = {name: dict(points) for name, points in (history or {}).items()}

    def log_scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        for name, value in values.items():
            self.series.setdefault(f"{prefix}/{name}", {})[int(step)] = float(value)
        if prefix == "eval":
            draw_curves({os.path.basename(os.path.dirname(self.path)) or "run": self.series}, self.path)


def earlier_history(save_dir: str, global_step: int) -> Series:
    """What the run in ``save_dir`` logged up to ``global_step`` (a resume point), from its train.log."""
    path = os.path.join(save_dir, "train.log")
    return parse_train_log(path, until_step=global_step) if global_step and os.path.isfile(path) else {}
