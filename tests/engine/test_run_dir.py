"""One run per output folder: a held lock refuses a second run; another run's checkpoints are not
silently replaced; a lock of a process that has ended is taken over."""

import errno
import json
import logging
import multiprocessing
import os
import runpy
import socket
import subprocess
import sys

import pytest
from ppdist_testing import check_ok, run_tool, tiny_config, tiny_run_config

from ppdist.engine import run_lock
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import LOGGER_NAME, setup_logger
from ppdist.engine.run_dir import LOCK_NAME, RunDirLock, claim_run_dir
from ppdist.engine.setup import build_trainer
from ppdist.errors import ConfigError


def write_lock(folder, pid, host=None):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, LOCK_NAME), "w", encoding="utf-8") as handle:
        json.dump(
            {"host": host or socket.gethostname(), "pid": pid, "job": None, "started": "earlier"}, handle
        )


def test_a_lock_held_by_a_live_process_refuses_with_its_holder(tmp_path):
    write_lock(str(tmp_path), os.getppid())  # our parent: alive
    with pytest.raises(ConfigError, match=f"in use by another run .*pid {os.getppid()}"):
        RunDirLock(str(tmp_path)).acquire()


def test_a_lock_of_an_ended_process_is_taken_over_and_released(tmp_path):
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    write_lock(str(tmp_path), int(ended.stdout))
    lock = RunDirLock(str(tmp_path))
    lock.acquire()
    with open(lock.path, encoding="utf-8") as handle:
        assert json.load(handle)["pid"] == os.getpid()
    lock.release()
    assert not os.path.exists(lock.path)


def test_another_runs_checkpoints_are_not_replaced_unless_resuming_or_told(tmp_path):
    (tmp_path / "latest.pt").write_bytes(b"x")
    glob = {"save_model_dir": str(tmp_path), "checkpoints": None, "overwrite": False}
    with pytest.raises(
        ConfigError, match="already holds a run's checkpoints \\(latest.pt\\).*Global.overwrite=true"
    ):
        claim_run_dir({"Global": glob}, DistEnv())
    for allowed in ({"checkpoints": "auto"}, {"overwrite": True}):
        claim_run_dir({"Global": dict(glob, **allowed)}, DistEnv()).release()


@pytest.mark.slow
def test_a_second_train_in_the_same_folder_exits_2_and_leaves_the_first_intact(tmp_path, digits_dir):
    out = tmp_path / "out"
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(out), epochs=1, num_train=64)
    check_ok(run_tool(["train.py", "-c", cfg, "-o", "Global.eval_batch_epoch=null"]))
    before = (out / "latest.pt").read_bytes()
    again = run_tool(["train.py", "-c", cfg])
    assert again.returncode == 2 and "already holds a run's checkpoints" in again.stderr, again.stderr
    assert (out / "latest.pt").read_bytes() == before and not (out / LOCK_NAME).exists()


def glob_of(folder, **extra):
    return dict({"save_model_dir": str(folder), "checkpoints": None, "overwrite": False}, **extra)


def test_a_foreign_checkpoint_is_not_resumed_over_another_runs_checkpoints(tmp_path):
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    for run in (run_a, run_b):
        run.mkdir()
        (run / "latest.pt").write_bytes(b"x")
    foreign = str(run_b / "latest.pt")
    with pytest.raises(ConfigError) as refused:
        claim_run_dir({"Global": glob_of(run_a, checkpoints=foreign)}, DistEnv())
    message = str(refused.value)
    assert f"{run_a} already holds a run's checkpoints (latest.pt)" in message
    assert f"Global.checkpoints {foreign} is another run's checkpoint" in message
    assert "Global.overwrite=true" in message and "\n" not in message
    # the folder's own checkpoints, a foreign one into an empty folder, or told to replace: allowed
    for folder, extra in (
        (run_a, {"checkpoints": str(run_a / "latest.pt")}),
        (run_a, {"checkpoints": str(run_a / "latest")}),
        (tmp_path / "new", {"checkpoints": foreign}),
        (run_a, {"checkpoints": foreign, "overwrite": True}),
    ):
        claim_run_dir({"Global": glob_of(folder, **extra)}, DistEnv()).release()


def test_auto_in_a_folder_with_only_best_accuracy_is_refused(tmp_path):
    (tmp_path / "best_accuracy.pt").write_bytes(b"x")
    with pytest.raises(ConfigError) as refused:
        claim_run_dir({"Global": glob_of(tmp_path, checkpoints="auto")}, DistEnv())
    message = str(refused.value)
    assert "holds a run's checkpoints (best_accuracy.pt) but no latest.pt" in message
    assert f"-o Global.checkpoints={tmp_path / 'best_accuracy'}" in message
    assert (tmp_path / "best_accuracy.pt").read_bytes() == b"x" and not (tmp_path / LOCK_NAME).exists()


def test_a_folder_with_only_snapshots_holds_a_run(tmp_path):
    for name in ("iter_epoch_1.pt", "iter_epoch_2.pt"):
        (tmp_path / name).write_bytes(b"x")
    os.utime(tmp_path / "iter_epoch_1.pt", (1, 1))  # the older one
    with pytest.raises(ConfigError, match=r"checkpoints \(iter_epoch_1.pt, iter_epoch_2.pt\); continue"):
        claim_run_dir({"Global": glob_of(tmp_path)}, DistEnv())
    with pytest.raises(ConfigError, match=f"-o Global.checkpoints={tmp_path / 'iter_epoch_2'},"):
        claim_run_dir({"Global": glob_of(tmp_path, checkpoints="auto")}, DistEnv())


@pytest.mark.parametrize("pid", ["abc", None, 1.5])
def test_a_lock_with_a_pid_that_is_not_a_number_is_taken_over_on_this_host(tmp_path, pid):
    write_lock(str(tmp_path), pid)
    lock = RunDirLock(str(tmp_path))
    lock.acquire()
    assert lock.notes == [
        f"took over the lock of a run that has ended: {lock.path} (host {socket.gethostname()}, pid {pid}, since earlier)"
    ]
    lock.release()
    assert os.listdir(tmp_path) == []


def test_a_lock_of_another_host_with_a_text_pid_is_refused_in_one_line(tmp_path):
    write_lock(str(tmp_path), "abc", host="elsewhere")
    with pytest.raises(ConfigError, match="in use by another run \\(host elsewhere, pid abc"):
        RunDirLock(str(tmp_path)).acquire()


def test_without_hard_links_the_lock_is_still_taken_and_refused_when_held(tmp_path, monkeypatch):
    def no_links(*args):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)  # e.g. some FUSE / SMB mounts
    lock = RunDirLock(str(tmp_path))
    lock.acquire()
    with open(lock.path, encoding="utf-8") as handle:
        assert json.load(handle)["pid"] == os.getpid()
    write_lock(str(tmp_path / "held"), os.getppid())
    with pytest.raises(ConfigError, match="in use by another run"):
        RunDirLock(str(tmp_path / "held")).acquire()
    lock.release()
    assert os.listdir(tmp_path) == ["held"]


def claim_error(folder) -> str:
    with pytest.raises(ConfigError) as refused:
        claim_run_dir({"Global": glob_of(folder)}, DistEnv())
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_an_empty_or_file_save_model_dir_is_one_config_error(tmp_path):
    assert "Global.save_model_dir is empty" in claim_error("")
    (tmp_path / "file").write_text("x")
    assert "is a file, not a folder" in claim_error(tmp_path / "file")
    assert "is a file, not a folder" in claim_error(tmp_path / "file" / "run")


@pytest.mark.parametrize(
    "where, error",
    [
        ("_create", OSError(errno.EROFS, "Read-only file system")),
        ("_create", PermissionError(errno.EACCES, "Permission denied")),
        ("_fill", OSError(errno.ENOSPC, "No space left on device")),
    ],
)
def test_an_unwritable_or_full_folder_is_one_config_error_and_leaves_no_lock(
    tmp_path, monkeypatch, where, error
):
    def fail(*args):
        raise error

    monkeypatch.setattr(run_lock, where, fail)
    message = claim_error(tmp_path)
    assert f"cannot write the lock file {tmp_path / LOCK_NAME}" in message and error.strerror in message
    assert os.listdir(tmp_path) == []


def test_a_file_as_save_model_dir_exits_2_in_one_line(tmp_path, digits_dir, monkeypatch, capsys, repo_root):
    (tmp_path / "taken").write_text("x")
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "taken"), epochs=1, num_train=64)
    monkeypatch.setattr(sys, "argv", ["train.py", "-c", cfg])
    with pytest.raises(SystemExit) as exited:  # tools/train.py in this process: no second torch import
        runpy.run_path(os.path.join(repo_root, "tools", "train.py"), run_name="__main__")
    stderr = capsys.readouterr().err
    assert exited.value.code == 2 and stderr.count("\n") == 1, stderr
    assert "is a file, not a folder" in stderr and (tmp_path / "taken").read_text() == "x"


def take_stale_lock(folder, start, done):
    """Exit code: 10 took the lock, 11 refused (in use), 1 anything else."""
    start.wait()
    lock, code = RunDirLock(folder), 1
    try:
        lock.acquire()
        code = 10
    except ConfigError:
        code = 11
    finally:
        done.wait(timeout=60)  # hold the lock until every process has tried
        lock.release()
        os._exit(code)


def test_of_several_processes_taking_over_the_same_stale_lock_exactly_one_wins(tmp_path):
    context = multiprocessing.get_context("fork")
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    for trial in range(12):
        folder = str(tmp_path / str(trial))
        write_lock(folder, int(ended.stdout))
        start, done = context.Barrier(4), context.Barrier(4)
        procs = [context.Process(target=take_stale_lock, args=(folder, start, done)) for _ in range(4)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(90)
        assert sorted(proc.exitcode for proc in procs) == [10, 11, 11, 11], f"trial {trial}"
        assert os.listdir(folder) == [], os.listdir(folder)


def test_overwrite_removes_the_replaced_runs_artifacts_and_says_which(tmp_path, caplog):
    names = ["latest.pt", "best_accuracy.pt", "iter_epoch_3.pt", "iter_step_40.pt", "train.log"]
    names += ["config.yml", "curves.png"]
    for name in names + ["notes.txt"]:
        (tmp_path / name).write_text("old")
    for folder in ("tensorboard", "eval_pictures", "mlruns"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x").write_text("old")
    with caplog.at_level("INFO", logger="ppdist"):
        claim = claim_run_dir({"Global": glob_of(tmp_path, overwrite=True)}, DistEnv())
        claim.report()
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME, "mlruns", "notes.txt"]
    lines = [r.getMessage() for r in caplog.records if "Global.overwrite" in r.getMessage()]
    assert len(lines) == 1 and "train.log" in lines[0] and "tensorboard/" in lines[0], lines
    claim.release()


def test_overwrite_keeps_the_files_of_a_run_it_continues(tmp_path):
    (tmp_path / "latest.pt").write_text("old")
    (tmp_path / "train.log").write_text("old")
    for setting in ("auto", str(tmp_path / "latest.pt")):
        claim = claim_run_dir({"Global": glob_of(tmp_path, overwrite=True, checkpoints=setting)}, DistEnv())
        assert claim.removed == [] and (tmp_path / "train.log").read_text() == "old"
        claim.release()


def test_an_overwriting_api_run_starts_a_fresh_train_log_that_says_what_was_removed(tmp_path, digits_dir):
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):  # a fresh interpreter: build_trainer opens train.log itself
        logger.removeHandler(handler)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "latest.pt").write_bytes(b"old")
    (folder / "train.log").write_text("cur metric, acc: 0.9 OLD RUN\n")
    config = tiny_run_config(tmp_path, digits_dir, "run", ["Global.overwrite=true", "Global.use_gpu=false"])
    trainer = build_trainer(config, DistEnv())
    trainer.hook("run_dir").claim.release()
    setup_logger(None)  # closes train.log
    log = (folder / "train.log").read_text()
    assert "OLD RUN" not in log and not (folder / "latest.pt").exists()
    assert f"Global.overwrite: removed the replaced run's latest.pt, train.log from {folder}" in log
