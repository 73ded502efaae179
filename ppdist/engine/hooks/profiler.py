"""The profiler hook: ``torch.profiler`` on a window of training steps (``Global.profiler_options``).

The window ``batch_range = [start, end)`` counts steps from 0 as PaddleOCR does: the step that
begins at ``global_step == start`` is the first profiled, the one that brings ``global_step`` to
``end`` the last; the step before the window warms the profiler up. Each profiled step is the
trace's ``ProfilerStep#N`` (N: the step's 0-based index) and spans the step, the hooks that run
after it and the wait for the next batch. Rank 0 profiles (``ranks=all``: every rank, one file
each). Written to ``profile_path`` (default ``save_model_dir/profiler``): ``rank<r>.<ms>.pt.trace.json``
(a Chrome trace: TensorBoard's profiler plugin, https://ui.perfetto.dev, chrome://tracing) and
``rank<r>.key_averages.txt``, the operator table that is also logged. ``exit_on_finished`` (the
default, as in PaddleOCR) ends the run after the window, on every rank.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any, Dict, List, Optional

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile

from ppdist.config.profiler_options import ProfilerOptions
from ppdist.engine.hooks.base import Hook
from ppdist.errors import ConfigError

logger = logging.getLogger("ppdist")
PRIORITY_PROFILER = 90  # after every other hook: a profiled step includes what they do after it
TABLE_ROWS = 30
TRACER_ARGUMENTS: Dict[str, Dict[str, bool]] = {
    "Default": {},
    "OpDetail": {"record_shapes": True},
    "AllOpDetail": {"record_shapes": True, "profile_memory": True, "with_stack": True},
}


def window_schedule(start: int, end: int) -> Any:
    """``torch.profiler`` schedule of the window: warm up on step ``start - 1``, record
    ``start .. end - 1`` and hand the trace over after ``end - 1``."""

    def action(step: int) -> ProfilerAction:
        if step == start - 1:
            return ProfilerAction.WARMUP
        if start <= step < end - 1:
            return ProfilerAction.RECORD
        if step == end - 1:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.NONE

    return action


def sort_key(sorted_key: str, on_cuda: bool) -> str:
    """PaddleOCR's ``sorted_key`` as a ``key_averages().table`` column (torch's table has no
    per-call maximum or minimum: those sort by total)."""
    if sorted_key == "calls":
        return "count"
    if sorted_key == "ave":
        return "device_time" if on_cuda else "cpu_time"
    return "device_time_total" if on_cuda else "cpu_time_total"


class TorchProfiler(Hook):
    """Profiles the steps of ``options.batch_range`` (``ppdist.config.profiler_options``) into
    ``options.profile_path`` or ``default_dir``; also logs the window's time per step and
    throughput (all that ``timer_only=true`` does)."""

    name = "profiler"
    priority = PRIORITY_PROFILER

    def __init__(self, options: ProfilerOptions, default_dir: str) -> None:
        self.options = options
        self.start, self.end = options.batch_range
        self.trace_dir = os.path.abspath(options.profile_path or default_dir)
        self.prof: Optional[profile] = None
        self.trace_files: List[str] = []
        self.window_clock: Optional[float] = None
        self.window_steps = self.window_samples = 0

    # ------------------------------------------------------------------ hook stages
    def before_train(self) -> None:
        env = self.trainer.env
        if self.options.ranks is not None and self.options.ranks >= env.world_size:
            raise ConfigError(
                f"Global.profiler_options: ranks={self.options.ranks}, but the run has {env.world_size} "
                f"process(es); give a rank below {env.world_size} or ranks=all"
            )
        if self.trainer.position.global_step >= self.end:
            logger.info(
                "profiler: the window [%d, %d) lies before this run's first step (%d): nothing to profile",
                self.start,
                self.end,
                self.trainer.position.global_step,
            )
            return
        self._warn_past_the_end(self.trainer.total_steps)
        if self._profiles_here() and not self.options.timer_only:
            self._check_trace_dir()

    def _warn_past_the_end(self, total_steps: int) -> None:
        """Say at the start when the window (0-based step indices) reaches past the last step."""
        if self.start >= total_steps:
            logger.warning(
                "profiler: the window batch_range=[%d, %d) starts after this run's last step (index %d of "
                "%d steps): nothing will be profiled; lower Global.profiler_options batch_range",
                self.start,
                self.end,
                total_steps - 1,
                total_steps,
            )
        elif self.end > total_steps:
            logger.warning(
                "profiler: the window batch_range=[%d, %d) ends after this run's %d steps: only steps "
                "[%d, %d) will be profiled",
                self.start,
                self.end,
                total_steps,
                self.start,
                total_steps,
            )

    def _check_trace_dir(self) -> None:
        """The trace folder is made and writable before the first step (not mid-training)."""
        try:
            os.makedirs(self.trace_dir, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.trace_dir):
                pass
        except OSError as exc:
            raise ConfigError(
                f"Global.profiler_options: the profile_path {self.trace_dir} cannot be written "
                f"({exc.strerror or exc}); give a writable profile_path"
            ) from exc

    def before_step(self) -> None:
        step = self.trainer.position.global_step  # 0-based index of the step about to run
        if step >= self.end:
            return
        if self.prof is None and self._profiles_here() and not self.options.timer_only:
            if step >= self.start - 1:
                self._start_profiler(step)
        if step >= self.start and self.window_clock is None:
            self._synchronize()
            self.window_clock = time.perf_counter()

    def after_step(self) -> None:
        step = self.trainer.position.global_step  # steps done, the one just run included
        window_ends = step == self.end and self.window_clock is not None
        if self.window_clock is not None and step <= self.end:
            self.window_steps += 1
            self.window_samples += self.trainer.last_step.samples
        elapsed = self._elapsed() if window_ends else 0.0  # before the trace is written
        if self.prof is not None:
            self.prof.step()
            if step >= self.end:
                self.prof.stop()
                self.prof = None
        if window_ends:
            self._log_timing(elapsed)
            if self.options.exit_on_finished:
                self.trainer.request_stop(
                    f"Global.profiler_options: exit_on_finished after the profiled steps [{self.start}, {self.end})"
                )

    def after_train(self) -> None:
        if self.prof is not None:  # the schedule ended inside the window: keep what was recorded
            self.prof.stop()
            self.prof = None

    # ------------------------------------------------------------------ the profiler
    def _profiles_here(self) -> bool:
        return self.options.ranks is None or self.options.ranks == self.trainer.env.rank

    def _on_cuda(self) -> bool:
        return self.trainer.env.device.type == "cuda" and self.options.state in ("GPU", "All")

    def _start_profiler(self, step: int) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._on_cuda() else [])
        if self.options.state == "GPU" and not self._on_cuda():
            logger.info("profiler: state=GPU without a CUDA device: CPU activities only")
        if self.options.sorted_key in ("max", "min"):
            logger.info(
                "profiler: sorted_key=%s: torch's table has none; sorted by total", self.options.sorted_key
            )
        os.makedirs(self.trace_dir, exist_ok=True)
        self.prof = profile(
            activities=activities,
            schedule=window_schedule(self.start, self.end),
            on_trace_ready=self._write,
            **TRACER_ARGUMENTS[self.options.tracer_option],
        )
        self.prof.step_num = step  # ProfilerStep#N: the step's index, as batch_range counts
        self.prof.start()

    def _write(self, prof: profile) -> None:
        """The trace and the operator table of the window (``on_trace_ready``)."""
        rank = self.trainer.env.rank
        path = os.path.join(self.trace_dir, f"rank{rank}.{int(time.time() * 1000)}.pt.trace.json")
        prof.export_chrome_trace(path)
        self.trace_files.append(path)
        averages = prof.key_averages(group_by_input_shape=self.options.tracer_option != "Default")
        table = averages.table(
            sort_by=sort_key(self.options.sorted_key, self._on_cuda()), row_limit=TABLE_ROWS
        )
        with open(
            os.path.join(self.trace_dir, f"rank{rank}.key_averages.txt"), "w", encoding="utf-8"
        ) as handle:
            handle.write(table + "\n")
        logger.info("profiler: steps [%d, %d) traced to %s\n%s", self.start, self.end, path, table)

    def _synchronize(self) -> None:
        if self.trainer.env.device.type == "cuda":
            torch.cuda.synchronize(self.trainer.env.device)

    def _elapsed(self) -> float:
        self._synchronize()
        return time.perf_counter() - self.window_clock

    def _log_timing(self, elapsed: float) -> None:
        logger.info(
            "profiler: steps [%d, %d): %d step(s) in %.3f s, %.5f s/step, ips: %.5f samples/s",
            self.start,
            self.end,
            self.window_steps,
            elapsed,
            elapsed / max(self.window_steps, 1),
            self.window_samples / elapsed if elapsed > 0 else 0.0,
        )
