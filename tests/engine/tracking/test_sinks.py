"""The MLflow and W&B sinks on their own, offline: checkpoints uploaded as artifacts when
Global.tracker_checkpoints asks, a crashed run marked FAILED, the flattened config params; an
unreachable MLflow server or a file in TensorBoard's place said in one line."""

from __future__ import annotations

import os
import socket
import time

import pytest
from mlflow.tracking import MlflowClient
from tracker_testing import offline_wandb, wandb_artifacts, wandb_records

from ppdist.engine.tracking import MLflowSink, WandbSink
from ppdist.engine.tracking.mlflow_sink import flatten_config
from ppdist.engine.tracking.tensorboard import TensorBoardSink
from ppdist.errors import ConfigError, TrackerError


def test_config_params_are_flat_and_named_as_mlflow_accepts():
    config = {
        "Global": {"epoch_num": 3, "hooks": None},
        "Train": {"dataset": {"transforms": [{"A": 1}]}},
        "x@y": {},
    }
    assert flatten_config(config) == [
        ("Global.epoch_num", "3"),
        ("Global.hooks", "None"),
        ("Train.dataset.transforms", "[{'A': 1}]"),
        ("x_y", "{}"),
    ]


def test_mlflow_uploads_checkpoints_renames_bad_metric_names_and_marks_an_unclosed_run_failed(tmp_path):
    store = str(tmp_path / "mlruns")
    checkpoint = tmp_path / "latest.pt"
    checkpoint.write_bytes(b"weights")
    sink = MLflowSink(store, "exp", run_name="r", checkpoints="artifact")
    sink.log_checkpoint("latest", str(checkpoint), 7)
    sink.log_scalars("eval", {"mAP@0.5": 0.25}, 7)  # a name MLflow would refuse
    client = MlflowClient(tracking_uri=store)
    assert [(m.step, m.value) for m in client.get_metric_history(sink.run_id, "eval/mAP_0.5")] == [(7, 0.25)]
    local = client.download_artifacts(sink.run_id, "checkpoints/latest.pt", str(tmp_path / "down"))
    assert open(local, "rb").read() == b"weights"
    sink._end_unfinished()  # what atexit does when training crashed before close
    assert client.get_run(sink.run_id).info.status == "FAILED"


def test_wandb_uploads_checkpoints_as_artifacts(tmp_path, monkeypatch):
    offline_wandb(monkeypatch, str(tmp_path / "wandb_home"))
    checkpoint = tmp_path / "best_accuracy.pt"
    checkpoint.write_bytes(b"weights")
    sink = WandbSink(
        {"mode": "offline", "dir": str(tmp_path), "project": "p"}, {"Global": {}}, checkpoints="artifact"
    )
    sink.log_scalars("eval", {"acc": 0.75}, 5)
    sink.log_checkpoint("best_accuracy", str(checkpoint), 5)
    sink.close()
    (run_dir,) = [p for p in (tmp_path / "wandb").iterdir() if p.name.startswith("offline-run-")]
    (artifact,) = wandb_artifacts(wandb_records(str(run_dir)))
    assert {"best_accuracy", "best"} <= set(artifact.aliases)
    (entry,) = artifact.manifest.contents
    assert entry.path == "best_accuracy.pt" and entry.ref == ""  # a copy, not a reference
    assert '"metrics":{"acc":0.75}' in artifact.metadata.replace(" ", "")
    assert os.path.exists(checkpoint)


def test_an_mlflow_server_that_refuses_connections_is_named_within_seconds():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(TrackerError, match=rf"the tracking server http://127.0.0.1:{port} is unreachable"):
        MLflowSink(f"http://127.0.0.1:{port}", "exp")
    assert time.monotonic() - started < 10


def test_a_file_where_the_tensorboard_folder_goes_is_one_config_error(tmp_path):
    (tmp_path / "tensorboard").write_text("")
    with pytest.raises(ConfigError, match=r"TensorBoard's folder .*tensorboard is a file, not a folder"):
        TensorBoardSink(str(tmp_path / "tensorboard"))
