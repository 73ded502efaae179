"""SLANet trains on the shared trainer with no table-specific code in it: a tiny model on small
synthetic tables trains, evaluates structure accuracy and TEDS, checkpoints, and a run resumed from
its first epoch's checkpoint ends with the uninterrupted run's weights and metrics."""

import math

import pytest
import torch
from ppdist_testing import tiny_table_config

from ppdist.config import load_config
from ppdist.data.synthetic_table import generate_table_dataset
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    generate_table_dataset(str(root / "data"), num_train=32, num_val=8, seed=5, max_rows=3, max_cols=3)
    return root


def trained(root, name, overrides=(), start_step=0):
    path = tiny_table_config(str(root / f"{name}.yml"), str(root / "data"), str(root / name))
    trainer = build_trainer(load_config(path, list(overrides)), DistEnv())
    assert trainer.position.global_step == start_step
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def full(tables):
    setup_logger(None)
    return trained(tables, "full")


def test_tiny_slanet_trains_and_evaluates_accuracy_and_teds(full, tables):
    assert full.position.global_step == 8  # 32 tables / 8, 2 epochs
    metrics = full.hook("evaluation").last_metrics
    assert set(metrics) >= {"acc", "teds"}
    # TEDS is 1 - distance / the larger table's node count, unclamped as ppstructure's: an untrained
    # model's malformed tables can score below 0 (a training log line here shows -0.03), never above 1
    assert 0.0 <= metrics["acc"] <= 1.0 and math.isfinite(metrics["teds"]) and metrics["teds"] <= 1.0
    saved = torch.load(tables / "full" / "latest.pt", weights_only=True)
    assert saved["position"]["global_step"] == 8
    assert saved["model"]["head.structure_generator.1.weight"].shape[0] == 30  # sos + 28 tokens + eos
    assert (tables / "full" / "best_accuracy.pt").is_file()


@pytest.mark.slow
def test_resumed_run_ends_as_the_uninterrupted_one(full, tables):
    first = trained(tables, "first", ["Global.epoch_num=1"])
    assert first.position.global_step == 4
    resumed = trained(tables, "first", ["Global.checkpoints=auto"], start_step=4)
    assert resumed.position.global_step == 8
    for key, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    assert resumed.hook("evaluation").last_metrics == full.hook("evaluation").last_metrics
