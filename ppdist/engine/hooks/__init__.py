"""Hooks of the training loop: the interface (``base``) and the built-in hooks, each owning its state."""

from ppdist.engine.hooks.bad_samples import BadSampleCheck
from ppdist.engine.hooks.base import Hook
from ppdist.engine.hooks.checkpointing import Checkpointer
from ppdist.engine.hooks.curves import TrainingCurves
from ppdist.engine.hooks.early_stopping import EarlyStopping
from ppdist.engine.hooks.evaluation import Evaluation
from ppdist.engine.hooks.nonfinite_guard import NonFiniteGuard
from ppdist.engine.hooks.profiler import TorchProfiler
from ppdist.engine.hooks.run_dir import RunDirRelease
from ppdist.engine.hooks.trackers import MLflowTracker, TrackerHook, WandbTracker
from ppdist.engine.hooks.train_log import TrainLogger

__all__ = [
    "BadSampleCheck",
    "Checkpointer",
    "EarlyStopping",
    "Evaluation",
    "Hook",
    "MLflowTracker",
    "NonFiniteGuard",
    "RunDirRelease",
    "TorchProfiler",
    "TrainingCurves",
    "TrackerHook",
    "TrainLogger",
    "WandbTracker",
]
