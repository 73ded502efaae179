"""Steady-state throughput: per-step times, their median without epoch ends, and the window's mean.

A step's time is the interval from the end of the step before it to its own end (a CUDA event
per step on a GPU, read after the window: no synchronisation inside it). Epoch ends (the
``latest`` checkpoint, evaluation, the loader's restart, epoch-end hooks) fall into the interval
of the step after them; the median leaves those steps out, so a short synthetic epoch does not
pass its epoch ends off as the step's cost. The mean over the whole window stays beside it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from ppdist.engine.hooks.base import PRIORITY_CLOCK, Hook


class StepMarks:
    """End-of-step marks on ``device``'s clock: ``perf_counter`` on the host, CUDA events on a
    GPU (recorded on the current stream, timed after ``seconds_between`` synchronises)."""

    def __init__(self, device: Optional[torch.device] = None) -> None:
        self.cuda = device is not None and device.type == "cuda"
        self.marks: List[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> List[float]:
        """Seconds between consecutive marks (one fewer than the marks)."""
        if self.cuda and self.marks:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) / 1000.0 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


class StepClock(Hook):
    """A trainer hook that times steps ``warmup+1 .. warmup+iters`` (by global step) one by one.

    The window runs from the end of step ``warmup`` to the end of the last one, so start-up
    (workers, first-iteration allocations, compilation, cuDNN autotuning) stays out. A step
    that follows an epoch end is flagged ``epoch_end`` and left out of the median. It runs
    before every other hook, so that their work on a step stays in the next step's interval.
    """

    name = "step_clock"
    priority = PRIORITY_CLOCK

    def __init__(self, warmup: int, iters: int, device: Optional[torch.device] = None) -> None:
        self.warmup, self.iters = int(warmup), int(iters)
        self.clock = StepMarks(device)
        self.steps: List[Dict[str, Any]] = []
        self.started = self.ended = False
        self.epoch_ended = False

    def after_step(self) -> None:
        step = self.trainer.last_step
        self.record(
            {
                "global_step": self.trainer.position.global_step,
                "samples": step.samples,
                "reader_cost": step.reader_cost,
                "batch_cost": step.batch_cost,
            }
        )

    def after_epoch(self) -> None:
        self.epoch_ended = True

    def record(self, step: Mapping[str, float]) -> None:
        """Count one step: ``{global_step, samples, reader_cost, batch_cost}``."""
        global_step = int(step["global_step"])
        if global_step == self.warmup:
            self.clock.mark()
            self.started = True
        elif self.started and self.warmup < global_step <= self.warmup + self.iters:
            self.clock.mark()
            self.steps.append(dict(step, epoch_end=self.epoch_ended))
            self.ended = global_step == self.warmup + self.iters
        self.epoch_ended = False

    def throughput(self) -> Dict[str, Any]:
        """The window's summary (``window_summary``) from its per-step times."""
        if not (self.started and self.ended):
            raise RuntimeError(
                f"the run ended before step {self.warmup + self.iters} ({len(self.steps)} timed step(s))"
            )
        return window_summary(self.steps, self.clock.intervals())


def window_summary(steps: Sequence[Mapping[str, Any]], intervals: Sequence[float]) -> Dict[str, Any]:
    """samples/s over the window (``samples_per_s``, the mean) and per step (``median_samples_per_s``:
    the median step's time over the steps that follow no epoch end), with the mean reader and batch
    costs the trainer reported. ``steps[i]`` took ``intervals[i]`` seconds."""
    samples = sum(float(s["samples"]) for s in steps)
    seconds = float(sum(intervals))
    steady = [t for s, t in zip(steps, intervals) if not s.get("epoch_end")]
    steady_samples = [float(s["samples"]) for s in steps if not s.get("epoch_end")]
    median_step = statistics.median(steady) if steady else seconds / max(len(steps), 1)
    per_step = sum(steady_samples) / len(steady_samples) if steady_samples else samples / max(len(steps), 1)
    result = {
        "samples_per_s": samples / seconds if seconds > 0 else 0.0,
        "median_samples_per_s": per_step / median_step if median_step > 0 else 0.0,
        "median_step_s": median_step,
        "steps": len(steps),
        "epoch_ends": len(steps) - len(steady),
        "samples": int(samples),
        "seconds": seconds,
    }
    if steps and "batch_cost" in steps[0]:
        reader = sum(float(s["reader_cost"]) for s in steps) / len(steps)
        batch = sum(float(s["batch_cost"]) for s in steps) / len(steps)
        result.update(
            avg_reader_cost=reader,
            avg_batch_cost=batch,
            reader_fraction=reader / batch if batch > 0 else 0.0,
        )
    return result
