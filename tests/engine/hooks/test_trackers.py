"""MLflow and W&B (offline) beside TensorBoard: what they receive is what the log and the
evaluation produced, the config and the checkpoints, from rank 0 only; a tracker that cannot
start stops the run before training; a resumed training continues the tracker's run."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient
from ppdist_testing import tiny_run_config
from tracker_testing import (
    eval_log_values,
    offline_wandb,
    train_log_values,
    wandb_artifacts,
    wandb_config,
    wandb_history,
    wandb_records,
)

from ppdist.engine.dist import DistEnv
from ppdist.engine.hooks import MLflowTracker, WandbTracker
from ppdist.engine.logger import ScalarWriter, setup_logger
from ppdist.engine.setup import build_trainer
from ppdist.errors import TrackerError

TOLERANCE = 5e-7  # the log prints 6 decimals


@pytest.fixture
def quiet_trackers(monkeypatch, tmp_path):
    offline_wandb(monkeypatch, str(tmp_path / "wandb_home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def mlflow_run(save_dir):
    client = MlflowClient(tracking_uri=os.path.join(save_dir, "mlruns"))
    (run,) = client.search_runs([client.get_experiment_by_name("ppdist").experiment_id])
    return client, run


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def assert_close(found, expected):
    assert [step for step, _ in found] == [step for step, _ in expected]
    for (step, value), (_, want) in zip(found, expected):
        assert abs(value - want) <= TOLERANCE, (step, value, want)


def test_mlflow_and_wandb_get_the_logged_values_config_and_checkpoints(tmp_path, digits_dir, quiet_trackers):
    log_file = str(tmp_path / "run.log")
    setup_logger(log_file)
    overrides = [
        "Global.max_iters=12",
        "Global.eval_batch_epoch=null",
        "Global.eval_batch_step=[0,6]",
        "Global.mlflow={run_name: tiny, tags: {team: ocr}}",
        "wandb.project=ppdist-test",
        "wandb.mode=offline",
    ]
    config = tiny_run_config(tmp_path, digits_dir, "trk", overrides)
    save_dir = config["Global"]["save_model_dir"]
    trainer = build_trainer(config, DistEnv())
    trainer.train()
    setup_logger(None)
    with open(log_file, encoding="utf-8") as handle:
        text = handle.read()
    train_lines, eval_lines = train_log_values(text), eval_log_values(text)
    assert sorted(train_lines) == [5, 10, 12] and len(eval_lines) == 2

    client, run = mlflow_run(save_dir)
    run_id = run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny" and run.data.tags["team"] == "ocr"
    for key in ("loss", "lr"):
        expected = [(step, values[key]) for step, values in sorted(train_lines.items())]
        assert_close(history(client, run_id, f"train/{key}"), expected)
    for key in eval_lines[0]:
        assert_close(
            history(client, run_id, f"eval/{key}"), [(6, eval_lines[0][key]), (12, eval_lines[1][key])]
        )
    assert (
        run.data.params["Global.max_iters"] == "12"
        and run.data.params["Optimizer.lr.learning_rate"] == "0.002"
    )
    logged_config = yaml.safe_load(open(client.download_artifacts(run_id, "config.yml", str(tmp_path))))
    assert (
        logged_config["Global"]["save_model_dir"] == save_dir and logged_config["wandb"]["mode"] == "offline"
    )
    notes = {}
    for name in ("latest", "best_accuracy", "iter_epoch_1"):
        with open(client.download_artifacts(run_id, f"checkpoints/{name}.json", str(tmp_path))) as handle:
            notes[name] = json.load(handle)
        assert notes[name]["path"] == os.path.join(save_dir, f"{name}.pt")
        assert run.data.tags[f"checkpoint.{name}"] == notes[name]["path"]
    assert notes["latest"]["global_step"] == 12
    best = trainer.hook("evaluation").best
    assert notes["best_accuracy"]["global_step"] == best["best_step"]
    assert notes["best_accuracy"]["metrics"] == {k: v for k, v in best.items() if not k.startswith("best_")}

    (run_dir,) = [p for p in (tmp_path / "trk" / "wandb").iterdir() if p.name.startswith("offline-run-")]
    records = wandb_records(str(run_dir))
    rows = wandb_history(records)
    for key in ("train/loss", "train/lr", "eval/acc", "eval/norm_edit_dis"):  # the very values MLflow got
        found = sorted((row["global_step"], row[key]) for row in rows if key in row)
        assert found == history(client, run_id, key), key
    assert wandb_config(records)["Global"]["max_iters"] == 12
    artifacts = wandb_artifacts(records)
    assert {a.name for a in artifacts} == {f"model-{trainer.hook('wandb').run_id}"}
    aliases = [set(a.aliases) - {"latest"} for a in artifacts]  # W&B gives its newest version "latest" too
    assert sorted(map(sorted, aliases)) == [
        [],
        ["best", "best_accuracy"],
        ["best", "best_accuracy"],
        ["iter_epoch_1"],
    ]
    refs = {entry.ref for a in artifacts for entry in a.manifest.contents}
    assert "file://" + os.path.join(save_dir, "latest.pt") in refs


def test_a_resumed_training_continues_the_mlflow_run(tmp_path, digits_dir, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    setup_logger(None)
    overrides = ["Global.max_iters=6", "Global.mlflow=true", "Global.checkpoints=auto"]
    first = build_trainer(tiny_run_config(tmp_path, digits_dir, "res", overrides), DistEnv())
    first.train()
    overrides[0] = "Global.max_iters=12"
    second = build_trainer(tiny_run_config(tmp_path, digits_dir, "res", overrides), DistEnv())
    assert second.position.global_step == 6
    second.train()
    client, run = mlflow_run(str(tmp_path / "res"))  # one run only
    assert second.hook("mlflow").run_id == first.hook("mlflow").run_id == run.info.run_id
    assert run.info.status == "FINISHED" and run.data.tags["ppdist.resumed_at_step"] == "6"
    steps = [step for step, _ in history(client, run.info.run_id, "train/loss")]
    assert steps == [5, 6, 10, 12]


def fake_trainer(rank: int, save_dir: str) -> SimpleNamespace:
    env = SimpleNamespace(rank=rank, is_main=rank == 0)
    return SimpleNamespace(env=env, writer=ScalarWriter(None), save_dir=save_dir, config={"Global": {}})


def test_ranks_other_than_0_log_nothing_and_import_no_tracker(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # an import would fail
    monkeypatch.setitem(sys.modules, "wandb", None)
    for hook in (MLflowTracker({}), WandbTracker({"mode": "offline"})):
        hook.trainer = fake_trainer(1, str(tmp_path))
        hook.before_train()
        assert hook.trainer.writer.sinks == [] and hook.run_id is None and hook.state_dict() == {}
    assert not os.listdir(tmp_path)


def test_a_tracker_that_cannot_start_stops_the_run_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    hook = MLflowTracker({"tracking_uri": "http://127.0.0.1:9"})  # nothing listens on the discard port
    hook.trainer = fake_trainer(0, str(tmp_path))
    with pytest.raises(
        TrackerError,
        match=r"Global\.mlflow: the tracking server http://127.0.0.1:9 is unreachable .*turn Global\.mlflow off",
    ):
        hook.before_train()
    assert hook.trainer.writer.sinks == []
