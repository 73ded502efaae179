"""Global.keep_checkpoint_max: only the newest periodic snapshots stay; latest and best_accuracy always."""

import os

import pytest
import torch
from ppdist_testing import tiny_run_config

from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer


def checkpoints(folder) -> set:
    return {name for name in os.listdir(folder) if name.endswith(".pt")}


@pytest.mark.slow
def test_oldest_snapshots_are_deleted_and_the_list_is_rebuilt_on_resume(tmp_path, digits_dir):
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
    resumed.train()  # the list is rebuilt from the folder: iter_step_8, then iter_epoch_1
    assert checkpoints(folder) == {"latest.pt", "best_accuracy.pt", "iter_step_12.pt", "iter_epoch_1.pt"}
    assert resumed.hook("checkpoint").snapshots == ["iter_step_12", "iter_epoch_1"]


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


def small_set(tmp_path, digits_dir, lines=64):
    """Train.dataset of the first ``lines`` digit strings: short epochs."""
    with open(os.path.join(digits_dir, "train.txt"), encoding="utf-8") as handle:
        head = handle.readlines()[:lines]
    (tmp_path / "small.txt").write_text("".join(head), encoding="utf-8")
    return [
        f"Train.dataset.label_file_list=[{tmp_path / 'small.txt'}]",
        "Train.loader.batch_size_per_card=16",
    ]


def test_a_resumed_epoch_run_keeps_only_the_newest_snapshot_and_logs_the_deletion(
    tmp_path, digits_dir, capsys
):
    """``latest`` is written before the epoch's snapshot, so the snapshot list it holds lacks the
    newest one: the list is rebuilt from the folder when a run starts, and nothing leaks."""
    setup_logger(None)
    folder = tmp_path / "run"
    common = ["Global.keep_checkpoint_max=1", "Global.eval_batch_epoch=1"] + small_set(tmp_path, digits_dir)
    for epochs, resume in ((1, []), (2, ["Global.checkpoints=auto"])):
        config = tiny_run_config(
            tmp_path, digits_dir, "run", common + [f"Global.epoch_num={epochs}"] + resume
        )
        build_trainer(config, DistEnv()).train()
        assert checkpoints(folder) == {"latest.pt", "best_accuracy.pt", f"iter_epoch_{epochs}.pt"}
    removed = [line for line in capsys.readouterr().out.splitlines() if "keep_checkpoint_max" in line]
    assert len(removed) == 1, removed
    assert removed[0].endswith(f"INFO: removed {folder / 'iter_epoch_1.pt'} (Global.keep_checkpoint_max 1)")


def test_latest_is_written_once_at_the_end_and_holds_the_final_evaluation(tmp_path, digits_dir, monkeypatch):
    setup_logger(None)
    config = tiny_run_config(
        tmp_path,
        digits_dir,
        "run",
        ["Global.epoch_num=1", "Global.eval_batch_epoch=null"] + small_set(tmp_path, digits_dir),
    )
    trainer = build_trainer(config, DistEnv())
    saved = []
    save = trainer.save
    monkeypatch.setattr(
        trainer,
        "save",
        lambda name, extra=None, copies=(), **more: (
            saved.append([name, *copies]),
            save(name, extra, copies, **more),
        ),
    )
    trainer.train()
    # the final evaluation, then the epoch's end: latest and its snapshot from one host copy
    assert saved == [["best_accuracy"], ["latest", "iter_epoch_1"]]
    state = torch.load(tmp_path / "run" / "latest.pt", weights_only=True)
    assert state["hooks"]["evaluation"]["last_eval_step"] == trainer.position.global_step == 4
    assert state["hooks"]["evaluation"]["best"]["best_step"] == 4
