"""Global.keep_checkpoint_max: only the newest periodic snapshots stay; latest and best_accuracy always."""

import os

import torch
from ppdist_testing import tiny_run_config

from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer


def checkpoints(folder) -> set:
    return {name for name in os.listdir(folder) if name.endswith(".pt")}


def test_oldest_snapshots_are_deleted_and_the_list_survives_a_resume(tmp_path, digits_dir):
    setup_logger(None)
    common = ["Global.save_iter_step=2", "Global.keep_checkpoint_max=2", "Global.eval_batch_epoch=null"]
    trainer = build_trainer(
        tiny_run_config(tmp_path, digits_dir, "run", common + ["Global.max_iters=8"]), DistEnv()
    )
    trainer.train()
    folder = tmp_path / "run"
    # iteration-based: iter_step_2..8 written, the epoch's end (step 8) adds iter_epoch_1
    assert checkpoints(folder) == {"latest.pt", "best_accuracy.pt", "iter_step_8.pt", "iter_epoch_1.pt"}
    assert trainer.hook("checkpoint").snapshots == ["iter_step_8", "iter_epoch_1"]
    assert torch.load(folder / "iter_step_8.pt", weights_only=True)["position"]["global_step"] == 8

    resumed = build_trainer(
        tiny_run_config(
            tmp_path, digits_dir, "run", common + ["Global.max_iters=12", "Global.checkpoints=auto"]
        ),
        DistEnv(),
    )
    assert resumed.hook("checkpoint").snapshots == ["iter_step_8", "iter_epoch_1"]
    resumed.train()
    assert checkpoints(folder) == {"latest.pt", "best_accuracy.pt", "iter_step_12.pt", "iter_epoch_1.pt"}


def test_without_a_limit_every_snapshot_is_kept(tmp_path, digits_dir):
    setup_logger(None)
    config = tiny_run_config(
        tmp_path,
        digits_dir,
        "run",
        ["Global.save_iter_step=3", "Global.max_iters=6", "Global.eval_batch_epoch=null"],
    )
    build_trainer(config, DistEnv()).train()
    assert {"iter_step_3.pt", "iter_step_6.pt", "iter_epoch_1.pt", "latest.pt"} <= checkpoints(
        tmp_path / "run"
    )
