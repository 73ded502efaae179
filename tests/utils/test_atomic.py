"""Atomic writes: the target is replaced in one step and no temporary file is left behind."""

import os
import stat

import pytest
import torch

from ppdist.utils.atomic import atomic_file, temporary_path, torch_save_atomic, write_text_atomic


def test_temporary_name_is_hidden_unique_and_beside_the_target(tmp_path):
    target = str(tmp_path / "config.yml")
    first, second = temporary_path(target), temporary_path(target)
    assert first != second
    assert os.path.dirname(first) == str(tmp_path)
    name = os.path.basename(first)
    assert name.startswith(".config.yml.") and name.endswith(".tmp")


def test_text_write_creates_the_folder_and_replaces(tmp_path):
    target = str(tmp_path / "sub" / "a.txt")
    write_text_atomic(target, "one\n")
    write_text_atomic(target, "two\n")
    with open(target, encoding="utf-8") as handle:
        assert handle.read() == "two\n"
    assert os.listdir(tmp_path / "sub") == ["a.txt"]


def test_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = str(tmp_path / "a.txt")
    write_text_atomic(target, "old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_file(target) as handle:
            handle.write("partial")
            raise KeyboardInterrupt
    with open(target, encoding="utf-8") as handle:
        assert handle.read() == "old"
    assert os.listdir(tmp_path) == ["a.txt"]


def test_torch_save_round_trip(tmp_path):
    target = str(tmp_path / "w.pt")
    torch_save_atomic({"w": torch.arange(3)}, target)
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.arange(3))
    assert os.listdir(tmp_path) == ["w.pt"]


def test_the_file_is_synced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    calls = []
    fsync, replace = os.fsync, os.replace

    def record_fsync(fd):
        calls.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        fsync(fd)

    def record_replace(src, dst):
        calls.append(f"replace -> {os.path.basename(dst)}")
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "replace", record_replace)
    torch_save_atomic({"w": torch.arange(3)}, str(tmp_path / "latest.pt"))
    assert calls == ["fsync file", "replace -> latest.pt", "fsync folder"]
