"""The checkpoint hook: ``latest`` and ``iter_epoch_N`` on their cadence, and the resolved config."""

from __future__ import annotations

import os
from typing import Optional

from ppdist.config import dump_config
from ppdist.engine.hooks.base import PRIORITY_CHECKPOINT, Hook

LATEST_NAME = "latest"
CONFIG_NAME = "config.yml"


class Checkpointer(Hook):
    """Writes ``latest`` at the end of every epoch (and of the run), ``iter_epoch_N`` every
    ``save_epoch_step`` epochs, and with ``save_iter_step`` also ``latest`` every N global steps
    within an epoch, so that a restart loses little work. Saving is collective (every rank's RNG
    state goes into the file). Before training, rank 0 writes the trainer's resolved config to
    ``save_dir/config.yml``."""

    name = "checkpoint"
    priority = PRIORITY_CHECKPOINT

    def __init__(self, save_epoch_step: int = 1, save_iter_step: Optional[int] = None) -> None:
        self.save_epoch_step = int(save_epoch_step)
        self.save_iter_step = save_iter_step

    def before_train(self) -> None:
        trainer = self.trainer
        if trainer.env.is_main and trainer.config is not None and trainer.save_dir:
            dump_config(trainer.config, os.path.join(trainer.save_dir, CONFIG_NAME))

    def after_step(self) -> None:
        trainer = self.trainer
        due = self.save_iter_step and trainer.position.global_step % self.save_iter_step == 0
        if due and not trainer.epoch_done and not trainer.finished:  # the epoch's end saves anyway
            trainer.save(LATEST_NAME)

    def after_epoch(self) -> None:
        trainer = self.trainer
        trainer.save(LATEST_NAME)
        if trainer.epoch % self.save_epoch_step == 0:
            trainer.save(f"iter_epoch_{trainer.epoch}")
