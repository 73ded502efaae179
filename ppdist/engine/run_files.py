"""What a training run leaves in its ``save_model_dir``: the checkpoints that make the folder a run's
(``existing_run_files``) and every artifact ``Global.overwrite`` deletes so that the new run starts
clean (``remove_run_artifacts``): checkpoints and snapshots, ``train.log``, ``config.yml``,
``curves.png``, TensorBoard events, the final evaluation's pictures and profiler traces. Nothing
else in the folder is touched (``mlruns``, an MLflow store, keeps every run by itself)."""

from __future__ import annotations

import os
import re
import shutil
from typing import List

RUN_FILES = ("latest.pt", "best_accuracy.pt")
SNAPSHOT_PATTERN = re.compile(r"^iter_(epoch|step)_\d+\.pt$")
ARTIFACT_FILES = RUN_FILES + ("train.log", "config.yml", "converted_config.yml", "curves.png")
ARTIFACT_DIRS = ("tensorboard", "eval_pictures", "profiler")


def existing_run_files(folder: str) -> List[str]:
    """The checkpoints of a run that ``folder`` holds: ``latest.pt``, ``best_accuracy.pt``, then the
    snapshots, oldest first (a new run's ``keep_checkpoint_max`` would delete those)."""
    kept = [name for name in RUN_FILES if os.path.isfile(os.path.join(folder, name))]
    return kept + snapshot_files(folder)


def describe(names: List[str], shown: int = 4) -> str:
    """``a, b, c, d and 3 more``."""
    listed = ", ".join(names[:shown])
    return listed if len(names) <= shown else f"{listed} and {len(names) - shown} more"


def snapshot_files(folder: str) -> List[str]:
    """The periodic snapshots (``iter_epoch_N.pt``, ``iter_step_N.pt``) in ``folder``, oldest first
    (by modification time, then name)."""
    try:
        names = [name for name in os.listdir(folder) if SNAPSHOT_PATTERN.match(name)]
    except OSError:
        return []
    return sorted(names, key=lambda name: (os.path.getmtime(os.path.join(folder, name)), name))


def remove_run_artifacts(folder: str) -> List[str]:
    """Delete the artifacts of the run in ``folder``; returns the names removed (folders with a ``/``)."""
    if not os.path.isdir(folder):
        return []
    removed: List[str] = []
    for name in list(ARTIFACT_FILES) + snapshot_files(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path) or os.path.islink(path):
            os.remove(path)
            removed.append(name)
    for name in ARTIFACT_DIRS:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
            removed.append(name + "/")
    return removed
