"""Where a run starts: the checkpoint of ``Global.checkpoints`` (``auto``: ``latest`` if any process has
one), or a new run from the initial weights (``Architecture.Backbone.pretrained``, ``Global.pretrained_model``).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from ppdist.config import auto_scale_lr_base
from ppdist.engine import checkpoint as ckpt
from ppdist.engine.dist import DistEnv
from ppdist.engine.hooks.evaluation import Evaluation
from ppdist.engine.logger import format_metrics
from ppdist.engine.position import Layout
from ppdist.engine.trainer import Trainer
from ppdist.errors import CheckpointError, shared

logger = logging.getLogger("ppdist")
# what checkpoints of ppdist 0.1 kept at their top level, and where it lives now
LEGACY_POSITION_KEYS = (
    "next_epoch",
    "next_batch",
    "epoch_consumed",
    "global_step",
    "dataset_len",
    "batch_size_per_card",
    "world_size",
    "steps_per_epoch",
)
LEGACY_EVALUATION_KEYS = ("best", "last_eval_step")


def upgrade_legacy_checkpoint(state: Mapping[str, Any]) -> Dict[str, Any]:
    """A checkpoint written before the trainer had hooks (position and best metric at the top level)
    in today's layout: ``position`` and the evaluation hook's state under ``hooks``."""
    if "position" in state or "next_epoch" not in state:
        return dict(state)
    upgraded = {k: v for k, v in state.items() if k not in LEGACY_POSITION_KEYS + LEGACY_EVALUATION_KEYS}
    upgraded["position"] = {k: state[k] for k in LEGACY_POSITION_KEYS if k in state}
    evaluation = {k: state[k] for k in LEGACY_EVALUATION_KEYS if k in state}
    upgraded["hooks"] = {Evaluation.name: evaluation} if evaluation else {}
    return upgraded


def find_resume_state(
    setting: Optional[str], save_dir: str, env: DistEnv
) -> Optional[Tuple[Dict[str, Any], str]]:
    """``(state, source)`` of the checkpoint to resume (``auto``: ``save_dir/latest`` if any process
    has it), upgraded to today's layout; None for a new run."""
    if not setting:
        return None
    auto = setting == "auto"
    path = os.path.join(save_dir, "latest" + ckpt.SUFFIX) if auto else setting
    found = ckpt.load_across_ranks(path, env, missing_ok=auto)
    if found is None:
        logger.info("Global.checkpoints is 'auto' and %s does not exist: starting a new run", path)
        return None
    state, source = found
    return upgrade_legacy_checkpoint(state), source


def check_relayout_allowed(
    saved: Mapping[str, Any], layout: Layout, glob: Mapping[str, Any], source: str
) -> None:
    """A resume with another world size, batch or accumulation needs the sample position, and
    ``auto_scale_lr`` unless the global batch (batch x processes x accumulation) is the same."""
    saved_global_batch = (
        int(saved.get("batch_size_per_card", layout.batch_size))
        * int(saved["world_size"])
        * int(saved.get("accumulate_steps") or 1)
    )
    if saved_global_batch == layout.samples_per_step and "epoch_consumed" in saved and "dataset_len" in saved:
        return  # e.g. 8 processes -> 4 x Global.accumulate_steps 2: the same steps, the same LR
    if saved["world_size"] != layout.world_size:
        change = (
            f"{source} was written by a run with {saved['world_size']} process(es) and this run has "
            f"{layout.world_size}"
        )
    elif saved.get("batch_size_per_card", layout.batch_size) != layout.batch_size:
        change = (
            f"{source} was written with batch_size_per_card {saved['batch_size_per_card']} and this run "
            f"has {layout.batch_size}"
        )
    elif int(saved.get("accumulate_steps") or 1) != layout.accumulate_steps:
        change = (
            f"{source} was written with Global.accumulate_steps {int(saved.get('accumulate_steps') or 1)} "
            f"and this run has {layout.accumulate_steps}"
        )
    else:
        change = (
            f"{source}: the training set gives {layout.steps_per_epoch} batches per epoch but the "
            f"checkpoint was taken with {saved['steps_per_epoch']}; the data or batch size changed"
        )
    if auto_scale_lr_base(glob) is None:
        raise shared(
            CheckpointError(
                f"{change}; resume with the same number of processes and batch size, or set "
                f"Global.auto_scale_lr: {{base_batch_size: N}} to continue with the new layout "
                f"(learning rate rescaled, the epoch continues where it stopped), or start a new "
                f"run from it with Global.pretrained_model"
            )
        )
    if "epoch_consumed" not in saved or "dataset_len" not in saved:
        raise shared(
            CheckpointError(
                f"{change}, and the checkpoint does not record its sample position (written by an "
                f"older ppdist); resume it with its original layout"
            )
        )


def resume(trainer: Trainer, state: Mapping[str, Any], source: str, glob: Mapping[str, Any]) -> None:
    """Load ``state`` into ``trainer`` (another layout only with ``Global.auto_scale_lr``) and say where it continues."""
    saved = state.get("position") or {}
    check = functools.partial(check_relayout_allowed, glob=glob, source=source)
    trainer.load_state_dict(state, source, on_relayout=check)
    position = trainer.position
    trainer.last_good = (source, position.global_step)  # what a divergence after it resumes from
    if position.saved_layout(saved) != position.layout:
        logger.warning(
            "resuming a run of %d process(es) x %d per process with %d x %d (%s): "
            "epoch %d continues after %d of %d samples with %d batch(es) left; global_step %d -> %d; "
            "learning rate x%.4g of the configured one",
            saved["world_size"],
            saved.get("batch_size_per_card", 0),
            position.layout.world_size,
            position.layout.batch_size,
            "Global.auto_scale_lr" if auto_scale_lr_base(glob) else "the same global batch",
            position.next_epoch,
            position.epoch_consumed,
            position.layout.dataset_len,
            position.layout.steps_per_epoch - position.next_batch,
            saved["global_step"],
            position.global_step,
            position.layout.samples_per_step / (auto_scale_lr_base(glob) or position.layout.samples_per_step),
        )
    logger.info(
        "resumed from %s: epoch %d, batch %d, global_step %d; best so far: %s",
        source,
        position.next_epoch,
        position.next_batch,
        position.global_step,
        format_metrics(trainer.summary()) or "none yet",
    )


def resume_or_initialize(trainer: Trainer, config: Mapping[str, Any]) -> None:
    """Resume ``Global.checkpoints``; otherwise load the initial weights (and start the EMA from them)."""
    glob = config["Global"]
    found = find_resume_state(glob["checkpoints"], glob["save_model_dir"], trainer.env)
    if found is not None:
        resume(trainer, *found, glob)
    elif ckpt.load_initial_weights(trainer.model, config) and trainer.ema is not None:
        trainer.ema.module.load_state_dict(trainer.model.state_dict())
