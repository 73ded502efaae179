"""One run per output folder: a held lock refuses a second run; another run's checkpoints are not
silently replaced; a lock of a process that has ended is taken over."""

import json
import os
import socket
import subprocess
import sys

import pytest
from ppdist_testing import check_ok, run_tool, tiny_config

from ppdist.engine.dist import DistEnv
from ppdist.engine.run_dir import LOCK_NAME, RunDirLock, claim_run_dir
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


def test_a_second_train_in_the_same_folder_exits_2_and_leaves_the_first_intact(tmp_path, digits_dir):
    out = tmp_path / "out"
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(out), epochs=1, num_train=64)
    check_ok(run_tool(["train.py", "-c", cfg, "-o", "Global.eval_batch_epoch=null"]))
    before = (out / "latest.pt").read_bytes()
    again = run_tool(["train.py", "-c", cfg])
    assert again.returncode == 2 and "already holds a run's checkpoints" in again.stderr, again.stderr
    assert (out / "latest.pt").read_bytes() == before and not (out / LOCK_NAME).exists()
