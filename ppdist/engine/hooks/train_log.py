"""The log hook: PaddleOCR-style training lines, TensorBoard scalars and CUDA memory figures."""

from __future__ import annotations

import logging
import os
import time

import torch

from ppdist.engine.hooks.base import PRIORITY_LOG, Hook, ends_window
from ppdist.engine.logger import SmoothedValues, format_metrics, format_train_line
from ppdist.modeling.sync_batch_norm import SyncBatchNorm

logger = logging.getLogger("ppdist")


def count_trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def torchrun_restarts() -> int:
    """How many times torchrun has restarted this job's workers (0 outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


class TrainLogger(Hook):
    """Every ``period`` steps (and at the end of each epoch and of the run): one line with the
    epoch, global step, LR, the medians of the loss terms over the last ``smooth_window`` steps,
    the mean reader and batch costs and samples of the steps since the previous line, ips and the
    ETA (``format_train_line``), and the training metric of the log step's batch when the
    trainer computes one; the same values as TensorBoard scalars ``train/*`` when the
    trainer has a writer. Also the run's summary at the start and its end."""

    name = "log"
    priority = PRIORITY_LOG

    def __init__(self, period: int = 10, smooth_window: int = 20, memory_info: bool = True) -> None:
        self.period = int(period)
        self.smoothed = SmoothedValues(smooth_window)
        self.memory_info = memory_info
        self.run_start, self.steps_run = 0.0, 0
        self._reset_window()

    def _reset_window(self) -> None:
        self.reader_sum = self.batch_sum = self.samples_sum = 0.0
        self.window_steps = 0

    def before_train(self) -> None:
        trainer = self.trainer
        position = trainer.position
        logger.info("trainable parameters: %s", f"{count_trainable(trainer.model):,}")
        sync_bn = sum(isinstance(m, SyncBatchNorm) for m in trainer.model.modules())
        logger.info(
            "%d process(es)%s, device %s%s, %d batches/epoch per process, %d epochs, %d steps",
            trainer.env.world_size,
            f" (process group: {trainer.env.backend})" if trainer.env.backend else "",
            trainer.env.device,
            f", {sync_bn} SyncBatchNorm layers" if sync_bn else "",
            position.layout.steps_per_epoch,
            trainer.epoch_num,
            trainer.total_steps,
        )
        restarts = torchrun_restarts()
        if restarts:
            logger.warning(
                "torchrun restart %d (of at most %s): continuing at epoch %d, batch %d, global_step %d",
                restarts,
                os.environ.get("TORCHELASTIC_MAX_RESTARTS", "?"),
                position.next_epoch,
                position.next_batch,
                position.global_step,
            )
        self.run_start, self.steps_run = time.perf_counter(), 0

    def after_step(self) -> None:
        trainer, step = self.trainer, self.trainer.last_step
        self.smoothed.update(step.values)
        self.reader_sum += step.reader_cost
        self.batch_sum += step.batch_cost
        self.samples_sum += step.samples
        self.window_steps += 1
        self.steps_run += 1
        if not ends_window(trainer, self.period):
            return
        global_step = trainer.position.global_step
        mean_cost = (time.perf_counter() - self.run_start) / self.steps_run
        medians, lr = self.smoothed.medians(), trainer.current_lr()
        if trainer.env.is_main:  # the metric of this log step's batch (it reads the device)
            medians.update(trainer.train_metric_values(step))
        line = format_train_line(
            trainer.epoch,
            trainer.epoch_num,
            global_step,
            lr,
            medians,
            self.reader_sum / self.window_steps,
            self.batch_sum / self.window_steps,
            self.samples_sum / self.window_steps,
            (trainer.total_steps - global_step) * mean_cost,
            self._memory(),
        )
        logger.info(line)
        trainer.writer.add_scalars("train", dict(medians, lr=lr), global_step)
        self._reset_window()

    def after_train(self) -> None:
        restarts = torchrun_restarts()
        logger.info(
            "training finished: %d steps%s, best %s",
            self.trainer.position.global_step,
            f" ({restarts} torchrun restart(s))" if restarts else "",
            format_metrics(self.trainer.summary()) or "-",
        )

    def _memory(self) -> str:
        device = self.trainer.env.device
        if device.type != "cuda" or not self.memory_info:
            return ""
        reserved = torch.cuda.max_memory_reserved(device) / 2**20
        allocated = torch.cuda.max_memory_allocated(device) / 2**20
        return f"max_mem_reserved: {reserved:.0f} MB, max_mem_allocated: {allocated:.0f} MB"
