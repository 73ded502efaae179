"""BackgroundWriter: one write in flight, atomic files, outcomes taken on the caller's thread."""

import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from ppdist_testing import HANG_TIMEOUT_S, child_env

from ppdist.engine.checkpoint import load_file, save_atomic
from ppdist.engine.checkpoint.background import BackgroundWriter
from ppdist.errors import CheckpointError


class GatedWrite:
    """``save_atomic`` that waits for ``release`` first and records when each write starts and ends."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.events = []

    def __call__(self, state, path):
        self.events.append(("start", path))
        self.release.wait(timeout=60)
        save_atomic(state, path)
        self.events.append(("end", path))


def test_submit_returns_before_the_write_and_on_written_runs_once_the_files_are_whole(tmp_path):
    write = GatedWrite()
    writer = BackgroundWriter(write)
    latest, snapshot = str(tmp_path / "latest.pt"), str(tmp_path / "iter_epoch_1.pt")
    weight = torch.zeros(3)
    written = []
    writer.submit({"w": weight}, [latest, snapshot], on_written=lambda: written.append(True))
    weight += 1  # the training goes on: the files hold the state of the submit
    writer.poll()
    assert writer.pending and not (tmp_path / "latest.pt").exists() and written == []
    write.release.set()
    writer.wait()
    assert not writer.pending and written == [True]
    for path in (latest, snapshot):
        assert torch.equal(load_file(path)["w"], torch.zeros(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_epoch_1.pt", "latest.pt"]


def test_a_new_save_waits_for_the_write_in_flight(tmp_path):
    write = GatedWrite()
    writer = BackgroundWriter(write)
    first, second = str(tmp_path / "best_accuracy.pt"), str(tmp_path / "latest.pt")
    writer.submit({"step": 1}, [first])
    returned = []
    thread = threading.Thread(target=lambda: (writer.submit({"step": 2}, [second]), returned.append(True)))
    thread.start()
    time.sleep(0.2)
    assert returned == [] and write.events == [("start", first)]  # blocked behind the first write
    write.release.set()
    thread.join(timeout=60)
    writer.wait()
    assert returned == [True]
    assert write.events == [("start", first), ("end", first), ("start", second), ("end", second)]
    assert load_file(second)["step"] == 2


def test_a_failed_write_is_raised_by_the_next_poll_naming_the_file_and_the_step(tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("a file where the folder should be")
    writer = BackgroundWriter()
    writer.submit({"step": 3}, [str(blocker / "latest.pt")], label="global_step 3")
    deadline = time.monotonic() + 60
    with pytest.raises(CheckpointError) as caught:
        while time.monotonic() < deadline:
            writer.poll()
            time.sleep(0.01)
    message = str(caught.value)
    assert message.startswith(f"cannot write checkpoint {blocker / 'latest.pt'}: ")
    assert message.endswith("nothing was written (written in the background, the state of global_step 3)")
    assert not writer.pending
    writer.wait()  # taken once: nothing left to raise


def test_any_exception_of_the_write_becomes_a_checkpoint_error_naming_the_file(tmp_path):
    def broken(state, path):
        raise ValueError("a tensor the pickler cannot take\nsecond line")

    writer = BackgroundWriter(broken)
    path = str(tmp_path / "latest.pt")
    writer.submit({"step": 1}, [path], label="global_step 1")
    with pytest.raises(CheckpointError) as caught:
        writer.wait()
    assert str(caught.value) == (
        f"cannot write checkpoint {path}, the state of global_step 1: ValueError: a tensor the pickler cannot take"
    )


def test_a_write_left_pending_at_exit_is_finished_and_its_error_logged(tmp_path):
    script = textwrap.dedent(
        f"""
        import logging, sys
        logging.basicConfig(stream=sys.stderr, format="%(levelname)s: %(message)s")
        from ppdist.engine.checkpoint.background import BackgroundWriter
        good, bad = BackgroundWriter(), BackgroundWriter()
        good.submit({{"step": 5}}, [{str(tmp_path / "latest.pt")!r}])
        bad.submit({{"step": 5}}, [{str(tmp_path / "blocker" / "latest.pt")!r}], label="global_step 5")
        """
    )
    (tmp_path / "blocker").write_text("not a folder")
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=HANG_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert load_file(str(tmp_path / "latest.pt"))["step"] == 5
    assert f"ERROR: cannot write checkpoint {tmp_path / 'blocker' / 'latest.pt'}: " in done.stderr
    assert "the state of global_step 5)" in done.stderr


def test_without_background_the_submit_returns_with_the_files_whole_or_raises(tmp_path):
    # Global.checkpoint_in_background: false
    done = []
    writer = BackgroundWriter(background=False)
    path = str(tmp_path / "latest.pt")
    writer.submit({"step": torch.tensor(5)}, [path], label="global_step 5", on_written=lambda: done.append(1))
    assert done == [1] and not writer.pending
    assert int(torch.load(path, weights_only=True)["step"]) == 5

    def broken(state, path):
        raise OSError(28, "No space left on device")

    writer.write = broken
    with pytest.raises(
        CheckpointError, match=r"latest.pt, the state of global_step 6: OSError: .*No space left"
    ):
        writer.submit({"step": torch.tensor(6)}, [path], label="global_step 6")
    assert not writer.pending and int(torch.load(path, weights_only=True)["step"]) == 5
