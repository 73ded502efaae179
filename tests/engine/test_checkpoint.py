"""Checkpoints: atomic writes, safe loading, RNG round trip, pretrained loading."""

import os
import pickle
import random

import numpy as np
import pytest
import torch
from torch import nn

from ppdist.engine import checkpoint as ckpt
from ppdist.errors import CheckpointError, CheckpointPathError
from ppdist.utils.rng import capture_rng_state, restore_rng_state


def test_atomic_save_replaces_and_leaves_no_tmp(tmp_path):
    path = str(tmp_path / "latest.pt")
    ckpt.save_atomic({"a": torch.ones(2)}, path)
    ckpt.save_atomic({"a": torch.zeros(2)}, path)
    assert os.listdir(tmp_path) == ["latest.pt"]
    assert torch.equal(ckpt.load_file(path)["a"], torch.zeros(2))


def test_interrupted_write_keeps_previous_file(tmp_path, monkeypatch):
    path = str(tmp_path / "latest.pt")
    ckpt.save_atomic({"step": 1}, path)

    def crash(obj, handle):
        handle.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_atomic({"step": 2}, path)
    assert ckpt.load_file(path)["step"] == 1


def test_weights_only_refuses_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pt"
    with open(path, "wb") as handle:
        pickle.dump({"model": Evil()}, handle)
    with pytest.raises(CheckpointError, match="cannot load"):
        ckpt.load_file(str(path))


def test_a_config_given_as_checkpoint_is_an_input_error_not_torchs_advice(tmp_path):
    """torch.load of a YAML file used to surface its weights_only=False advice."""
    config = tmp_path / "config.yml"
    config.write_text("Global:\n  epoch_num: 1\n")
    with pytest.raises(CheckpointPathError) as info:
        ckpt.load_file(str(config))
    assert str(info.value).startswith(f"{config} is not a checkpoint (not a file written by torch.save")
    assert "weights_only" not in str(info.value) and info.value.exit_code == 2


def test_checkpoint_path_resolution(tmp_path):
    ckpt.save_atomic({"x": 1}, str(tmp_path / "best_accuracy.pt"))
    assert ckpt.checkpoint_path(str(tmp_path / "best_accuracy")).endswith("best_accuracy.pt")
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        ckpt.checkpoint_path(str(tmp_path / "nothing"))


def test_rng_state_round_trip_through_weights_only_file(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = capture_rng_state()
    path = str(tmp_path / "rng.pt")
    ckpt.save_atomic({"rng": [state]}, path)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng_state(ckpt.load_file(path)["rng"][0])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_pretrained_skips_shape_mismatch_and_lists_it(tmp_path, caplog):
    src = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5))
    dst = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 7))
    ckpt.save_atomic({"model": src.state_dict()}, str(tmp_path / "w.pt"))
    loaded, mismatched, missing = ckpt.load_matching_weights(
        dst, ckpt.extract_model_state(ckpt.load_file(str(tmp_path / "w.pt"))), "w.pt"
    )
    assert torch.equal(dst[0].weight, src[0].weight)
    assert sorted(loaded) == ["0.bias", "0.weight"]
    assert len(mismatched) == 2 and "1.weight" in mismatched[0]
    assert missing == []  # mis-shaped tensors are listed once, as mismatches (issue 44)
