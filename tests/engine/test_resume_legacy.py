"""A checkpoint written by ppdist 0.1 (before the trainer had hooks) resumes with today's trainer
and continues the same run (fixture and its script: tests/fixtures/legacy_checkpoint/)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from ppdist.config import validate
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.resume import upgrade_legacy_checkpoint
from ppdist.engine.setup import build_trainer

FIXTURE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "legacy_checkpoint"
)


def fixture_script():
    spec = importlib.util.spec_from_file_location(
        "make_legacy_fixture", os.path.join(FIXTURE, "make_fixture.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_legacy_layout_is_upgraded():
    legacy = torch.load(os.path.join(FIXTURE, "mid_epoch.pt"), weights_only=True)
    assert "position" not in legacy and legacy["global_step"] == 5  # really the old layout
    state = upgrade_legacy_checkpoint(legacy)
    assert state["position"] == {
        "next_epoch": 1,
        "next_batch": 5,
        "epoch_consumed": 40,
        "global_step": 5,
        "dataset_len": 64,
        "batch_size_per_card": 8,
        "world_size": 1,
        "steps_per_epoch": 8,
    }
    assert state["hooks"] == {"evaluation": {"best": legacy["best"], "last_eval_step": 4}}
    assert state["model"] is legacy["model"] and state["rng"] is legacy["rng"]
    assert upgrade_legacy_checkpoint(state) == state  # today's layout passes through


@pytest.fixture
def two_threads():
    """The old run was made with 2 threads, and its last bits depend on how reductions split across
    threads (1 thread ends ~5e-3 away after 11 Adam steps); pytest -n workers run 1 thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_legacy_checkpoint_resumes_and_ends_where_the_old_run_ended(tmp_path, two_threads):
    setup_logger(None)
    script = fixture_script()
    data = script.write_dataset(str(tmp_path / "data"))
    mid_epoch = os.path.join(FIXTURE, "mid_epoch.pt")
    raw = script.config(data, str(tmp_path / "out"), checkpoints=mid_epoch)
    raw["Global"]["bn_statistics"] = "torch"  # ppdist 0.1 updated BN running_var by torch's rule
    config = validate(raw)
    trainer = build_trainer(config, DistEnv())
    position = trainer.position
    assert (position.next_epoch, position.next_batch, position.epoch_consumed, position.global_step) == (
        1,
        5,
        40,
        5,
    )
    legacy = torch.load(mid_epoch, weights_only=True)
    assert (
        trainer.hook("evaluation").best == legacy["best"] and trainer.hook("evaluation").last_eval_step == 4
    )
    assert trainer.ema.step == 5 and trainer.scheduler.last_step == 5
    trainer.train()

    old_run = torch.load(os.path.join(FIXTURE, "final.pt"), weights_only=True)
    assert (
        position.global_step == old_run["global_step"] == 16 and position.next_epoch == old_run["next_epoch"]
    )
    for key, value in old_run["model"].items():  # the same run (up to the CPU's float rounding)
        torch.testing.assert_close(trainer.model.state_dict()[key], value, rtol=1e-4, atol=1e-6, msg=key)
    best = trainer.hook("evaluation").best
    assert best.keys() == old_run["best"].keys() and best["best_step"] == old_run["best"]["best_step"]
    written = torch.load(tmp_path / "out" / "latest.pt", weights_only=True)
    assert written["position"]["global_step"] == 16 and "evaluation" in written["hooks"]
