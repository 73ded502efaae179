"""``curves.png``: the run's training curves, redrawn after every evaluation (rank 0)."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping, Optional

from ppdist.engine.tracking.base import Sink
from ppdist.visualize import Series, draw_curves, is_curve

logger = logging.getLogger("ppdist")
CURVES_NAME = "curves.png"


class CurvesSink(Sink):
    """Keeps every scalar the writer logs (``train/*``, ``eval/*``; costs and counts left out) and
    draws ``curves.png`` into ``save_dir`` each time evaluation metrics arrive, and once more at
    the end when values came after the last drawing. ``history`` seeds it with the earlier part of
    a resumed run. A drawing that fails is a warning: the values are still kept."""

    label = "curves"

    def __init__(self, save_dir: str, history: Optional[Series] = None) -> None:
        self.path = os.path.join(save_dir, CURVES_NAME)
        self.run_name = os.path.basename(os.path.normpath(save_dir)) or "run"
        self.series: Series = {name: dict(points) for name, points in (history or {}).items()}
        self.drawn = True  # nothing new since the last drawing

    def log_scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        for name, value in values.items():
            if is_curve(name):
                self.series.setdefault(f"{prefix}/{name}", {})[int(step)] = float(value)
                self.drawn = False
        if prefix == "eval":
            self.draw()

    def close(self) -> None:
        if not self.drawn:
            self.draw()

    def draw(self) -> None:
        """Write ``curves.png`` (atomically) from every value kept so far."""
        self.drawn = True
        if not self.series:
            return
        try:
            draw_curves({self.run_name: self.series}, self.path)
        except Exception as exc:  # a picture never stops the training, nor the values kept
            logger.warning("%s not drawn: %s: %s", self.path, type(exc).__name__, exc)


def series_state(series: Series) -> Dict[str, List[List[Any]]]:
    """``series`` as plain lists for a checkpoint: ``{name: [steps, values]}`` (loads with weights_only)."""
    return {name: [list(points), list(points.values())] for name, points in series.items()}


def series_from_state(state: Mapping[str, Any]) -> Series:
    """The inverse of ``series_state``."""
    return {
        name: dict(zip((int(s) for s in steps), (float(v) for v in values)))
        for name, (steps, values) in state.items()
    }
