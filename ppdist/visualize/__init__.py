"""Pictures drawn from what ppdist already computes and logs (matplotlib, Agg, no display)."""

from ppdist.visualize.curves import draw_curves
from ppdist.visualize.train_log import Series, parse_train_log, read_run, read_tensorboard

__all__ = ["Series", "draw_curves", "parse_train_log", "read_run", "read_tensorboard"]
