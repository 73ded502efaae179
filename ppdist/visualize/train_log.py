"""A run's logged scalars, read back from its ``train.log`` or its TensorBoard events.

A run is a ``Series``: ``{"train/loss": {step: value}, "train/lr": {...}, "eval/acc": {...}}``,
the names TensorBoard gets (``ppdist.engine.logger.ScalarWriter``). From ``train.log``: the
values of each training line (``epoch: [e/E], global_step: N, lr: ..., loss: ..., ...``; the
costs, ips and ETA left out) under ``train/``, and each ``cur metric, ..., global_step: N``
line under ``eval/`` at step N (a line without it, from an older version: the step of its
``eval step N`` progress line, else of the last training line). Several trainings may append
to one log: a resumed one (``resumed from ...: epoch E, batch B, global_step N``) replaces what
the interrupted one logged after step N (a step logged again: the last value wins), one
started afresh replaces everything before it, so the series is the run as it went on.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional, Tuple

Series = Dict[str, Dict[int, float]]

TRAIN_LINE = re.compile(r"epoch: \[\d+/\d+\], global_step: (\d+), (.*)$")
EVAL_LINE = re.compile(r"cur metric, (.*?)(?:, global_step: (\d+))?$")
EVAL_PROGRESS = re.compile(r"eval step (\d+):")
RUN_START = re.compile(r"\d+ process\(es\), device \S+, \d+ batches/epoch")
RESUMED = re.compile(r"resumed from .*: epoch \d+, batch \d+, global_step (\d+)[,;]")
RELAYOUT = re.compile(r"resuming a run of .*; global_step (\d+) -> (\d+);")
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


def is_curve(name: str) -> bool:
    """Whether ``name`` (``loss`` or ``train/loss``) is drawn: not a cost, a speed or a count."""
    return name.rsplit("/", 1)[-1] not in NOT_CURVES


def _pairs(text: str) -> Dict[str, float]:
    return {name: float(value) for name, value in PAIR.findall(text) if is_curve(name)}


def parse_train_log(path: str, until_step: Optional[int] = None) -> Series:
    """The scalars of the ``train.log`` at ``path`` (only steps up to ``until_step`` when given)."""
    series: Series = {}
    last_step, eval_step = 0, None
    resumed_at: Optional[int] = None
    relayout: Optional[Tuple[int, int]] = None
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            found = TRAIN_LINE.search(line)
            if found:
                last_step, eval_step = int(found.group(1)), None
                _add(series, "train", _pairs(found.group(2)), last_step)
                continue
            found = EVAL_PROGRESS.search(line)
            if found:
                eval_step = int(found.group(1))
                continue
            found = EVAL_LINE.search(line)
            if found:
                step = last_step if eval_step is None else eval_step
                step = int(found.group(2)) if found.group(2) else step
                _add(series, "eval", _pairs(found.group(1)), step)
                eval_step = None
                continue
            found = RELAYOUT.search(line)
            if found:
                relayout = (int(found.group(1)), int(found.group(2)))
                continue
            found = RESUMED.search(line)
            if found:
                resumed_at = int(found.group(1))
                continue
            if RUN_START.search(line):  # a training starts: resumed at a step, or afresh
                if relayout is not None:
                    series = rescale_steps(truncate(series, relayout[0]), *relayout)
                else:
                    series = truncate(series, resumed_at or 0)
                resumed_at, relayout, last_step = None, None, resumed_at or 0
    return series if until_step is None else truncate(series, until_step)


def _add(series: Series, prefix: str, values: Dict[str, float], step: int) -> None:
    for name, value in values.items():
        series.setdefault(f"{prefix}/{name}", {})[step] = value


def truncate(series: Series, step: int) -> Series:
    """``series`` without the values after ``step`` (names left without values dropped)."""
    kept = {name: {s: v for s, v in points.items() if s <= step} for name, points in series.items()}
    return {name: points for name, points in kept.items() if points}


def rescale_steps(series: Series, old_step: int, new_step: int) -> Series:
    """``series`` with its steps counted in another layout's steps: a run resumed with another
    global batch continues at ``new_step`` where it had reached ``old_step`` (``ppdist.engine.resume``)."""
    if old_step <= 0 or old_step == new_step:
        return series
    ratio = new_step / old_step
    return {name: {round(s * ratio): v for s, v in points.items()} for name, points in series.items()}


def read_tensorboard(log_dir: str) -> Series:
    """The scalars of the TensorBoard event files in ``log_dir`` (the last value of each step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415  (heavy)

    accumulator = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    series: Series = {}
    for tag in accumulator.Tags().get("scalars", []):
        if not is_curve(tag):
            continue
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
