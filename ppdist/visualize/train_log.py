"""A run's logged scalars, read back from its ``train.log`` or its TensorBoard events.

A run is a ``Series``: ``{"train/loss": {step: value}, "train/lr": {...}, "eval/acc": {...}}``,
the names TensorBoard gets (``ppdist.engine.logger.ScalarWriter``). From ``train.log``: the
values of each training line (``epoch: [e/E], global_step: N, lr: ..., loss: ..., ...``; the
costs, ips and ETA left out) under ``train/``, and each ``cur metric, ...`` line under
``eval/`` at the step of the evaluation (its ``eval step N`` progress lines, else the last
training line). A resumed run appends to the same log and may log a step again: the last
value of a step wins, which is the run as it went on.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional

Series = Dict[str, Dict[int, float]]

TRAIN_LINE = re.compile(r"epoch: \[\d+/\d+\], global_step: (\d+), (.*)$")
EVAL_LINE = re.compile(r"cur metric, (.*)$")
EVAL_PROGRESS = re.compile(r"eval step (\d+):")
PAIR = re.compile(r"([A-Za-z_][\w.@-]*): (-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|-?nan|-?inf)\b")
NOT_CURVES = frozenset(
    (
        "avg_reader_cost",
        "avg_batch_cost",
        "avg_samples",
        "ips",
        "eta",
        "fps",
        "images",
        "max_mem_reserved",
        "max_mem_allocated",
    )
)


def _pairs(text: str) -> Dict[str, float]:
    return {name: float(value) for name, value in PAIR.findall(text) if name not in NOT_CURVES}


def parse_train_log(path: str, until_step: Optional[int] = None) -> Series:
    """The scalars of the ``train.log`` at ``path`` (only steps up to ``until_step`` when given)."""
    series: Series = {}
    last_step, eval_step = 0, None
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            found = TRAIN_LINE.search(line)
            if found:
                last_step = int(found.group(1))
                _add(series, "train", _pairs(found.group(2)), last_step, until_step)
                continue
            found = EVAL_PROGRESS.search(line)
            if found:
                eval_step = int(found.group(1))
                continue
            found = EVAL_LINE.search(line)
            if found:
                step = eval_step if eval_step is not None else last_step
                _add(series, "eval", _pairs(found.group(1)), step, until_step)
                eval_step = None
    return series


def _add(series: Series, prefix: str, values: Dict[str, float], step: int, until_step: Optional[int]) -> None:
    if until_step is not None and step > until_step:
        return
    for name, value in values.items():
        series.setdefault(f"{prefix}/{name}", {})[step] = value


def read_tensorboard(log_dir: str) -> Series:
    """The scalars of the TensorBoard event files in ``log_dir`` (the last value of each step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415  (heavy)

    accumulator = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    series: Series = {}
    for tag in accumulator.Tags().get("scalars", []):
        for event in accumulator.Scalars(tag):
            series.setdefault(tag, {})[int(event.step)] = float(event.value)
    return series


def read_run(run_dir: str, source: str = "auto") -> Series:
    """The scalars of the run in ``run_dir``: its ``train.log`` (``source`` ``log``), its
    ``tensorboard`` folder (``tensorboard``), or the log when there is one (``auto``)."""
    log_path = os.path.join(run_dir, "train.log")
    board = os.path.join(run_dir, "tensorboard")
    if source == "log" or (source == "auto" and os.path.isfile(log_path)):
        if not os.path.isfile(log_path):
            raise FileNotFoundError(f"{run_dir} has no train.log")
        return parse_train_log(log_path)
    if not os.path.isdir(board):
        if os.path.isfile(log_path):  # asked for TensorBoard on a run trained without it
            raise FileNotFoundError(
                f"{run_dir} has no tensorboard folder (it was trained with Global.use_tensorboard off);"
                " its train.log is drawn without --source tensorboard"
            )
        raise FileNotFoundError(
            f"{run_dir} has no train.log and no tensorboard folder (Global.use_tensorboard): nothing to plot"
        )
    return read_tensorboard(board)
