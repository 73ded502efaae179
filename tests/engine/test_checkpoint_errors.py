"""Checkpoint read and write failures say what and where, and never lose the previous file."""

import os

import pytest
import torch

from ppdist.config import load_config
from ppdist.engine.checkpoint import checkpoint_path, load_file, save_atomic
from ppdist.errors import CheckpointError, ConfigError


def test_a_zero_byte_checkpoint_is_named_empty(tmp_path):
    empty = tmp_path / "latest.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="latest.pt: the file is empty"):
        load_file(str(empty))


def test_a_directory_is_not_reported_as_missing(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory, not a checkpoint"):
        checkpoint_path(str(tmp_path))
    with pytest.raises(ConfigError, match="is a directory; give a config file"):
        load_config(str(tmp_path))


def test_a_failed_write_keeps_the_previous_checkpoint_and_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "latest.pt"
    save_atomic({"step": 1}, str(path))

    def disk_full(obj, handle, *args, **kwargs):
        handle.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:858] . unexpected pos 128 vs 64")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(
        CheckpointError, match="latest.pt: the write stopped \\(is the disk full\\?\\).*previous one is kept"
    ):
        save_atomic({"step": 2}, str(path))
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert sorted(os.listdir(tmp_path)) == ["latest.pt"]


def test_a_file_where_the_folder_should_be_is_named(tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("not a folder")
    with pytest.raises(
        CheckpointError, match="cannot write checkpoint .*out/latest.pt: .*nothing was written"
    ):
        save_atomic({"step": 1}, str(blocker / "latest.pt"))
