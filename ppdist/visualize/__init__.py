"""Pictures drawn from what ppdist already computes and logs (matplotlib, Agg, no display)."""

from ppdist.visualize.curves import draw_curves
from ppdist.visualize.train_log import (
    Series,
    is_curve,
    parse_train_log,
    read_run,
    read_tensorboard,
    rescale_steps,
    truncate,
)

__all__ = [
    "Series",
    "draw_curves",
    "is_curve",
    "parse_train_log",
    "read_run",
    "read_tensorboard",
    "rescale_steps",
    "truncate",
]
