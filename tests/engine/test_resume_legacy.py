"""A checkpoint written by ppdist 0.1 (before the trainer had hooks) resumes with today's trainer
and continues the same run (fixture and its script: tests/fixtures/legacy_checkpoint/)."""

from __future__ import annotations

import importlib.util
import os

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


def test_legacy_checkpoint_resumes_and_ends_where_the_old_run_ended(tmp_path):
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
    # The same run, up to the CPU's rounding. This net's gradients carry a rounding spread of ~5e-5 of
    # their size between two reduction orders (1 or 2 threads, AVX2 or AVX-512 kernels), which 11
    # steps grow to ~0.2% of how far the weights moved from step 5 to 16 (measured); another batch order, learning
    # rate or optimizer state changes the path by the order of that distance itself. So the weights
    # (and BatchNorm statistics) must end within 5% of their travel from the old run's.
    start, ours = legacy["model"], trainer.model.state_dict()
    floats = [key for key, value in old_run["model"].items() if value.is_floating_point()]
    for key in set(old_run["model"]) - set(floats):
        assert torch.equal(ours[key], old_run["model"][key]), key

    def distance(a, b):
        return float(torch.cat([(a[key].double() - b[key].double()).flatten() for key in floats]).norm())

    error, travel = distance(ours, old_run["model"]), distance(old_run["model"], start)
    print(f"from the old run's weights: {error:.3e}; their travel since step 5: {travel:.3e}")
    assert error <= 0.05 * travel, (error, travel)
    best = trainer.hook("evaluation").best
    assert best.keys() == old_run["best"].keys() and best["best_step"] == old_run["best"]["best_step"]
    written = torch.load(tmp_path / "out" / "latest.pt", weights_only=True)
    assert written["position"]["global_step"] == 16 and "evaluation" in written["hooks"]
