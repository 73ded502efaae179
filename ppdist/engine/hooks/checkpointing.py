"""The checkpoint hook: ``latest`` and the periodic snapshots on their cadence (and their retention),
and the resolved config."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping, Optional

from ppdist.config import dump_config
from ppdist.engine import checkpoint as ckpt
from ppdist.engine.hooks.base import PRIORITY_CHECKPOINT, Hook
from ppdist.engine.run_files import snapshot_files

logger = logging.getLogger("ppdist")

LATEST_NAME = "latest"
CONFIG_NAME = "config.yml"


class Checkpointer(Hook):
    """Writes ``latest`` at the end of every epoch (and of the run), ``iter_epoch_N`` every
    ``save_epoch_step`` epochs, and with ``save_iter_step`` also ``latest`` every N global steps
    within an epoch, so that a restart loses little work; in an iteration-based run (``max_iters``)
    those steps also keep an ``iter_step_N`` snapshot (PaddleSeg's ``iter_N``). With
    ``keep_checkpoint_max`` only the newest that many snapshots (``iter_epoch_N``/``iter_step_N``)
    are kept: an older one is deleted once the new one is whole; ``latest`` and
    ``best_accuracy`` are never deleted, and each deletion is logged. When a run starts (a resume
    too) the list is rebuilt from the snapshots in the folder (oldest first), so that none that a
    checkpoint's list misses (a file holds the list from before its own save) is kept forever.
    The names saved at one moment (``latest`` and the epoch's snapshot) share one host copy and
    one background write (``Trainer.save``'s ``copies``). Saving is collective (every rank's RNG
    state goes into the file); ``after_train`` waits until the last files are whole. Before
    training, rank 0 writes the trainer's resolved config to ``save_dir/config.yml``. State: the
    snapshots written, oldest first."""

    name = "checkpoint"
    priority = PRIORITY_CHECKPOINT

    def __init__(
        self,
        save_epoch_step: int = 1,
        save_iter_step: Optional[int] = None,
        keep_checkpoint_max: Optional[int] = None,
    ) -> None:
        if keep_checkpoint_max is not None and keep_checkpoint_max < 1:
            raise ValueError(f"keep_checkpoint_max must be >= 1 or None, got {keep_checkpoint_max}")
        self.save_epoch_step = int(save_epoch_step)
        self.save_iter_step = save_iter_step
        self.keep_checkpoint_max = keep_checkpoint_max
        self.snapshots: List[str] = []

    def before_train(self) -> None:
        trainer = self.trainer
        if trainer.env.is_main and trainer.save_dir:
            self.snapshots = [os.path.splitext(name)[0] for name in snapshot_files(trainer.save_dir)]
            if trainer.config is not None:
                dump_config(trainer.config, os.path.join(trainer.save_dir, CONFIG_NAME))

    def after_step(self) -> None:
        trainer = self.trainer
        step = trainer.position.global_step
        if not (self.save_iter_step and step % self.save_iter_step == 0):
            return
        names = []
        if not trainer.epoch_done and not trainer.finished:  # the epoch's end saves anyway
            names.append(LATEST_NAME)
        if trainer.position.iteration_based:
            names.append(f"iter_step_{step}")
        self.save(names)

    def after_epoch(self) -> None:
        trainer = self.trainer
        names = [LATEST_NAME]
        if trainer.epoch % self.save_epoch_step == 0:
            names.append(f"iter_epoch_{trainer.epoch}")
        self.save(names)

    def after_train(self) -> None:
        """The last files are whole (and logged) before the run's closing line."""
        self.trainer.wait_for_checkpoints()

    def save(self, names: List[str]) -> None:
        """Save the state once under each of ``names`` (one host copy, one background write); the
        snapshots among them join the list, and those past ``keep_checkpoint_max`` are deleted
        once the new files are whole."""
        if not names:
            return
        kept = [name for name in self.snapshots if name not in names]
        kept += [name for name in names if name != LATEST_NAME]
        cut = len(kept) - self.keep_checkpoint_max if self.keep_checkpoint_max is not None else 0
        obsolete, kept = kept[: max(cut, 0)], kept[max(cut, 0) :]
        self.trainer.save(names[0], copies=names[1:], on_written=lambda: self._remove(obsolete))
        self.snapshots = kept  # the files hold the list from before this save

    def _remove(self, names: List[str]) -> None:
        """Rank 0 deletes the snapshot files ``names`` (and logs each)."""
        trainer = self.trainer
        if not (trainer.env.is_main and trainer.save_dir):
            return
        for name in names:
            path = os.path.join(trainer.save_dir, name + ckpt.SUFFIX)
            if os.path.exists(path):
                os.remove(path)
                logger.info("removed %s (Global.keep_checkpoint_max %d)", path, self.keep_checkpoint_max)

    def state_dict(self) -> Dict[str, Any]:
        return {"snapshots": list(self.snapshots)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.snapshots = [str(name) for name in state.get("snapshots", [])]
