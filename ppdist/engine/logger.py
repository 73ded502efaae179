"""Rank-aware logging in PaddleOCR's shape, smoothed values, and the writer of scalars to TensorBoard and the trackers."""

from __future__ import annotations

import collections
import datetime
import logging
import os
import statistics
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from ppdist.engine.tracking import GuardedSink, Sink, TensorBoardSink, numeric_values

LOGGER_NAME = "ppdist"


def setup_logger(log_file: Optional[str] = None, rank: int = 0) -> logging.Logger:
    """The ``ppdist`` logger: console + ``log_file`` on rank 0, errors only elsewhere."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.INFO if rank == 0 else logging.ERROR)
    logger.propagate = False
    formatter = logging.Formatter("[%(asctime)s] ppdist %(levelname)s: %(message)s", "%Y/%m/%d %H:%M:%S")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(formatter)
    logger.addHandler(console)
    if log_file and rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        file_handler = logging.FileHandler(log_file, mode="a", encoding="utf-8")
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
    return logger


class SmoothedValues:
    """Median over the last ``window`` values of each named scalar (PaddleOCR's log style).

    Values may be numbers or 0-d tensors; tensors are read only when the medians are asked for,
    all of them in one stacked transfer, so the training loop never waits for the device to log.
    """

    def __init__(self, window: int = 20) -> None:
        self.window = window
        self.values: Dict[str, collections.deque] = {}

    def update(self, items: Mapping[str, Any]) -> None:
        for key, value in items.items():
            self.values.setdefault(key, collections.deque(maxlen=self.window)).append(value)

    def medians(self) -> Dict[str, float]:
        self._read_tensors()
        return {k: statistics.median(v) for k, v in self.values.items() if v}

    def _read_tensors(self) -> None:
        """Replace the tensors still held by their values: one host transfer for all of them."""
        places = [
            (values, i)
            for values in self.values.values()
            for i, value in enumerate(values)
            if isinstance(value, torch.Tensor)
        ]
        if not places:
            return
        tensors = [values[i].detach().reshape(()).float() for values, i in places]
        device = tensors[0].device
        numbers = torch.stack([t.to(device) for t in tensors]).tolist()
        for (values, i), number in zip(places, numbers):
            values[i] = number


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6f}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in value) + "]"
    return str(value)


def format_metrics(values: Mapping[str, Any]) -> str:
    """``acc: 0.960000, norm_edit_dis: 0.991587, best_epoch: 6`` (floats to 6 decimals,
    per-class lists to 4)."""
    return ", ".join(f"{k}: {_format_value(v)}" for k, v in values.items())


def format_eval_line(metrics: Mapping[str, Any], fps: float, global_step: int) -> str:
    """``cur metric, acc: 0.960000, norm_edit_dis: 0.991587, fps: 240.98, global_step: 12``:
    PaddleOCR's evaluation line, with the step it was made at (``parse_train_log`` reads it)."""
    return f"cur metric, {format_metrics(metrics)}, fps: {fps:.2f}, global_step: {global_step}"


def format_eta(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(max(0.0, seconds))))


def format_train_line(
    epoch: int,
    epoch_num: int,
    global_step: int,
    lr: float,
    values: Mapping[str, float],
    reader_cost: float,
    batch_cost: float,
    samples: float,
    eta_s: float,
    extra: str = "",
) -> str:
    """``epoch: [1/72], global_step: 200, lr: 0.000500, loss: 3.21, ..., eta: 0:12:31``."""
    parts = [f"epoch: [{epoch}/{epoch_num}]", f"global_step: {global_step}", f"lr: {lr:.6f}"]
    parts += [f"{k}: {v:.6f}" for k, v in values.items()]
    ips = samples / batch_cost if batch_cost > 0 else 0.0
    parts += [
        f"avg_reader_cost: {reader_cost:.5f} s",
        f"avg_batch_cost: {batch_cost:.5f} s",
        f"avg_samples: {samples:g}",
        f"ips: {ips:.5f} samples/s",
        f"eta: {format_eta(eta_s)}",
    ]
    line = ", ".join(parts)
    return f"{line}, {extra}" if extra else line


class ScalarWriter:
    """``trainer.writer``: the one place the training's scalars and checkpoints are logged to,
    fanned out to its sinks — TensorBoard when ``log_dir`` is given, and whatever the tracker
    hooks add on rank 0 (MLflow, W&B). Every sink sees the same numbers at the same steps; a
    sink that fails is guarded (``GuardedSink``) and never stops the training."""

    def __init__(self, log_dir: Optional[str] = None, sinks: Sequence[Sink] = ()) -> None:
        self.sinks: List[GuardedSink] = []
        if log_dir:
            self.add_sink(TensorBoardSink(log_dir))
        for sink in sinks:
            self.add_sink(sink)

    def add_sink(self, sink: Sink) -> None:
        self.sinks.append(GuardedSink(sink))

    def add_scalars(self, prefix: str, values: Mapping[str, Any], step: int) -> None:
        """The numbers of ``values`` as ``<prefix>/<key>`` at ``step`` (lists and the like are left out)."""
        numbers = numeric_values(values)
        for sink in self.sinks:
            sink.log_scalars(prefix, numbers, step)

    def log_checkpoint(self, name: str, path: str, step: int) -> None:
        """The checkpoint ``name`` rank 0 just wrote to ``path`` at global step ``step``."""
        for sink in self.sinks:
            sink.log_checkpoint(name, path, step)

    def close(self) -> None:
        """End every sink's run; the writer is empty afterwards."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()
