"""A process killed (SIGKILL) while its background thread writes ``latest`` leaves the previous
``latest`` whole and loadable, and the trainer's background writes surface a failed write as a
``CheckpointError`` naming the file at the next step or at the end of training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from ppdist_testing import child_env, tiny_run_config

from ppdist.engine.dist import DistEnv
from ppdist.engine.setup import build_trainer
from ppdist.errors import CheckpointError

CHILD = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import ppdist.utils.atomic as atomic
    from ppdist.engine.checkpoint.background import BackgroundWriter

    folder = sys.argv[1]
    path = os.path.join(folder, "latest.pt")
    writer = BackgroundWriter()
    writer.submit({"step": torch.tensor(1), "weights": torch.arange(1000.0)}, [path])
    writer.wait()  # the first latest is whole

    real_save = torch.save

    def half_then_hang(obj, handle, *args, **kwargs):
        handle.write(b"PK\\x03\\x04 half a checkpoint")  # the temporary file holds a partial write
        handle.flush()
        open(os.path.join(folder, "writing"), "w").close()
        time.sleep(600)  # killed here, in the middle of the write

    atomic.torch.save = half_then_hang
    writer.submit({"step": torch.tensor(2), "weights": torch.zeros(1000)}, [path])
    for _ in range(6000):  # the training goes on while the thread writes
        time.sleep(0.1)
    """
)


def test_a_kill_in_the_middle_of_a_background_write_keeps_the_previous_latest(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], env=child_env())
    try:
        deadline = time.time() + 120
        while not (tmp_path / "writing").exists():
            assert child.poll() is None, "the child ended before writing"
            assert time.time() < deadline, "the background write never started"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    state = torch.load(tmp_path / "latest.pt", weights_only=True)
    assert int(state["step"]) == 1 and torch.equal(state["weights"], torch.arange(1000.0))
    strays = [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    assert len(strays) == 1 and strays[0].startswith(".latest.pt.")  # the partial write, beside it


def test_a_failed_background_write_stops_training_naming_the_file(tmp_path, digits_dir):
    config = tiny_run_config(tmp_path, digits_dir, "run", ["Global.eval_batch_step=[0, 100000]"])
    trainer = build_trainer(config, DistEnv())
    real_write = trainer.checkpoint_writer.write

    def full_disk(state, path):
        if os.path.basename(path) == "latest.pt":
            raise OSError(28, "No space left on device")
        real_write(state, path)

    trainer.checkpoint_writer.write = full_disk
    with pytest.raises(
        CheckpointError,
        match=r"cannot write checkpoint .*latest.pt, the state of global_step 32: OSError: .*No space left",
    ):
        trainer.train()
    # the first epoch's end failed: the run stopped at the next step's check, in the second epoch
    assert not trainer.finished and trainer.epoch == 2
    assert not (tmp_path / "run" / "latest.pt").exists()


def test_with_the_background_off_a_failed_write_stops_training_at_that_save(tmp_path, digits_dir):
    overrides = ["Global.eval_batch_step=[0, 100000]", "Global.checkpoint_in_background=false"]
    trainer = build_trainer(tiny_run_config(tmp_path, digits_dir, "run", overrides), DistEnv())
    assert not trainer.checkpoint_writer.background

    def full_disk(state, path):
        raise OSError(28, "No space left on device")

    trainer.checkpoint_writer.write = full_disk
    with pytest.raises(CheckpointError, match=r"latest.pt, the state of global_step 32: OSError"):
        trainer.train()
    # raised by the first epoch's save itself, before any step of the second epoch
    assert not trainer.finished and trainer.epoch == 1 and trainer.position.global_step == 32
