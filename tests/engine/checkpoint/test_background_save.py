"""Trainer.save writes the state of the moment it was called: the training steps that run (and
update the weights in place) while the background thread writes leave the file alone, and a run
resumed from that file ends exactly as the uninterrupted one."""

from __future__ import annotations

import os
import time

import pytest
import torch
from ppdist_testing import tiny_run_config

from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer

# half of the 512 samples / 16 = 16 batches per epoch; eval and best_accuracy at step 12
EVERY_12 = ["Global.eval_batch_epoch=null", "Global.eval_batch_step=[0,12]", "Train.dataset.ratio_list=[0.5]"]
STEPS_WHILE_WRITING = 3  # steps 13..15 run before the first best_accuracy file is written


def hold_first_best(trainer, snapshot):
    """Holds the first best_accuracy write until ``STEPS_WHILE_WRITING`` more steps have run,
    writes it to ``snapshot`` too; returns what was seen: the weights when save was called, and
    whether the live weights had moved on by the time the file was written."""
    seen = {}
    save, real_write = trainer.save, trainer.checkpoint_writer.write

    def save_and_remember(name, extra=None, **more):
        if name == "best_accuracy" and "at_save" not in seen:
            seen["at_save"] = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
            seen["step"] = trainer.position.global_step
        save(name, extra, **more)

    def slow_write(state, path):
        if os.path.basename(path) == "best_accuracy.pt" and "moved" not in seen:
            deadline = time.time() + 60
            while (
                trainer.position.global_step < seen["step"] + STEPS_WHILE_WRITING and time.time() < deadline
            ):
                time.sleep(0.01)
            # the parameters only: state_dict() would divide the BatchNorm variances back in place
            # (StatisticsBatchNorm) from this thread while a step runs, a race of the test's own
            live = dict(trainer.model.named_parameters())
            seen["moved"] = any(not torch.equal(p, seen["at_save"][k]) for k, p in live.items())
            seen["steps_run"] = trainer.position.global_step - seen["step"]
            real_write(state, snapshot)
        real_write(state, path)

    trainer.save = save_and_remember
    trainer.checkpoint_writer.write = slow_write
    return seen


@pytest.mark.slow
def test_steps_run_during_a_background_write_leave_the_file_and_the_resume_exact(tmp_path, digits_dir):
    setup_logger(None)
    snapshot = str(tmp_path / "snapshot.pt")
    full = build_trainer(tiny_run_config(tmp_path, digits_dir, "full", EVERY_12), DistEnv())
    seen = hold_first_best(full, snapshot)
    full.train()
    assert seen["step"] == 12 and seen["steps_run"] >= STEPS_WHILE_WRITING
    assert seen["moved"]  # the weights were updated in place while the file was being written
    written = torch.load(snapshot, weights_only=True)
    assert written["position"]["global_step"] == 12
    for key, value in seen["at_save"].items():
        assert torch.equal(written["model"][key], value), key

    resumed_config = tiny_run_config(
        tmp_path, digits_dir, "resumed", EVERY_12 + [f"Global.checkpoints={snapshot}"]
    )
    resumed = build_trainer(resumed_config, DistEnv())
    assert resumed.position.global_step == 12
    resumed.train()
    assert resumed.position.global_step == full.position.global_step == 32
    for key, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    assert resumed.hook("evaluation").best == full.hook("evaluation").best
