"""Steady-state throughput from the trainer's per-step reports."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional

import torch

from ppdist.engine.hooks.base import PRIORITY_CLOCK, Hook


class StepClock(Hook):
    """A trainer hook that timestamps the steps after ``warmup`` of them.

    The window is steps ``warmup+1 .. warmup+iters`` (by global step), timed from the end of
    step ``warmup`` to the end of the last one, so start-up (workers, first-iteration
    allocations, compilation) stays out. On CUDA the device is synchronised at both ends. It
    runs before every other hook, so that their work on the window's last step stays out too.
    """

    name = "step_clock"
    priority = PRIORITY_CLOCK

    def __init__(self, warmup: int, iters: int, device: Optional[torch.device] = None) -> None:
        self.warmup, self.iters = int(warmup), int(iters)
        self.sync = device is not None and device.type == "cuda"
        self.start: Optional[float] = None
        self.end: Optional[float] = None
        self.steps: List[Mapping[str, float]] = []

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

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

    def record(self, step: Mapping[str, float]) -> None:
        """Count one step: ``{global_step, samples, reader_cost, batch_cost}``."""
        global_step = int(step["global_step"])
        if global_step == self.warmup:
            self.start = self._now()
        elif self.warmup < global_step <= self.warmup + self.iters:
            self.steps.append(dict(step))
            if global_step == self.warmup + self.iters:
                self.end = self._now()

    def throughput(self) -> Dict[str, Any]:
        """samples/s over the window, and the mean reader/batch cost of its steps."""
        if self.start is None or self.end is None or not self.steps:
            raise RuntimeError(
                f"the run ended before step {self.warmup + self.iters} ({len(self.steps)} timed step(s))"
            )
        return window_summary(self.steps, self.end - self.start)


def window_summary(steps: List[Mapping[str, float]], seconds: float) -> Dict[str, Any]:
    samples = sum(float(s["samples"]) for s in steps)
    reader = sum(float(s["reader_cost"]) for s in steps) / len(steps)
    batch = sum(float(s["batch_cost"]) for s in steps) / len(steps)
    return {
        "samples_per_s": samples / seconds,
        "steps": len(steps),
        "samples": int(samples),
        "seconds": seconds,
        "avg_reader_cost": reader,
        "avg_batch_cost": batch,
        "reader_fraction": reader / batch if batch > 0 else 0.0,
    }
