"""MLflow: the run's config as params (and ``config.yml``), its scalars as metrics, its
checkpoints as references or artifacts, through ``MlflowClient`` (no global MLflow state)."""

from __future__ import annotations

import atexit
import logging
import os
import re
import socket
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from ppdist.engine.tracking.base import Sink
from ppdist.errors import TrackerError

logger = logging.getLogger("ppdist")
PARAM_VALUE_MAX = 500  # MLflow's limit before 2.x; the whole config is also an artifact
BATCH_PARAMS = 100  # MlflowClient.log_batch takes at most 100 params per call
FILE_STORE_SWITCH = "MLFLOW_ALLOW_FILE_STORE"  # MLflow 3 keeps its file store behind this switch
CONNECT_TIMEOUT_S = 5.0  # MLflow itself retries a refused connection for minutes, silently


def mlflow_name(name: str) -> str:
    """``name`` with the characters MLflow refuses in param and metric names replaced by ``_``."""
    return re.sub(r"[^\w.\- /:]", "_", name)


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> List[Tuple[str, str]]:
    """``[("Global.epoch_num", "72"), ...]``: nested mappings joined with dots, every other value
    as text cut to ``PARAM_VALUE_MAX`` characters; characters MLflow refuses in names become ``_``."""
    items: List[Tuple[str, str]] = []
    for key, value in config.items():
        name = mlflow_name(f"{prefix}{key}")
        if isinstance(value, Mapping) and value:
            items += flatten_config(value, name + ".")
        else:
            items.append((name, str(value)[:PARAM_VALUE_MAX]))
    return items


def is_file_store(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file:")


def check_reachable(uri: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise ``TrackerError`` within ``timeout_s`` when the server of an ``http(s)://`` tracking
    URI does not accept a connection (other stores are not probed)."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TrackerError(
            f"Global.mlflow: the tracking server {uri} is unreachable ({reason}); start it, fix "
            f"Global.mlflow.tracking_uri (or MLFLOW_TRACKING_URI), or turn Global.mlflow off"
        ) from exc


class MLflowSink(Sink):
    """A run in experiment ``experiment_name`` (created when missing) of ``tracking_uri``, or the
    run ``run_id`` continued when that store has it (a resumed training). ``checkpoints``:
    ``reference`` (a ``checkpoints/<name>.json`` artifact with the path, step and metrics, and a
    ``checkpoint.<name>`` tag), ``artifact`` (a copy under ``checkpoints/``) or ``none``. A run
    the process leaves without ``close`` (a crash) is marked FAILED at exit."""

    label = "mlflow"

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str,
        run_name: Optional[str] = None,
        tags: Optional[Mapping[str, str]] = None,
        checkpoints: str = "reference",
        run_id: Optional[str] = None,
        best_name: str = "best_accuracy",
    ) -> None:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415  (optional package, loaded when asked)

        if is_file_store(tracking_uri):
            os.environ.setdefault(FILE_STORE_SWITCH, "true")
        check_reachable(tracking_uri)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri, self.checkpoints, self.best_name = tracking_uri, checkpoints, best_name
        self.last_eval: Tuple[int, Dict[str, float]] = (-1, {})
        self.resumed = run_id is not None and self._continue(run_id)
        if not self.resumed:
            experiment = self.client.get_experiment_by_name(experiment_name)
            experiment_id = (
                experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
            )
            run = self.client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {}))
            self.run_id = run.info.run_id
        self.closed = False
        atexit.register(self._end_unfinished)
        logger.info(
            "mlflow: %s run %s in %s",
            "continuing" if self.resumed else "logging to",
            self.run_id,
            tracking_uri,
        )

    def _continue(self, run_id: str) -> bool:
        """Continue ``run_id`` when this tracking store has it; False (a new run) otherwise."""
        try:
            self.client.get_run(run_id)
        except Exception:  # MlflowException for a run this store does not have
            logger.warning(
                "mlflow: the checkpoint's run %s is not in %s; starting a new run", run_id, self.tracking_uri
            )
            return False
        self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        return True

    def log_config(self, config: Mapping[str, Any], step: int) -> None:
        """The resolved config: params (flattened; a continued run keeps the params it has, MLflow
        refuses to change them) and the whole of it as ``config.yml``."""
        from mlflow.entities import Param  # noqa: PLC0415

        if not self.resumed:
            params = [Param(k, v) for k, v in flatten_config(config)]
            for start in range(0, len(params), BATCH_PARAMS):
                self.client.log_batch(self.run_id, params=params[start : start + BATCH_PARAMS])
        else:
            self.client.set_tag(self.run_id, "ppdist.resumed_at_step", str(step))
        self.client.log_dict(self.run_id, dict(config), "config.yml")

    def log_scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_name(f"{prefix}/{k}"), v, now, step) for k, v in values.items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)
        if prefix == "eval":
            self.last_eval = (step, dict(values))

    def log_checkpoint(self, name: str, path: str, step: int) -> None:
        if self.checkpoints == "none":
            return
        if self.checkpoints == "artifact":
            self.client.log_artifact(self.run_id, path, "checkpoints")
            return
        note: Dict[str, Any] = {"name": name, "path": os.path.abspath(path), "global_step": step}
        if name == self.best_name and self.last_eval[0] == step:
            note["metrics"] = self.last_eval[1]
        self.client.log_dict(self.run_id, note, f"checkpoints/{name}.json")
        self.client.set_tag(self.run_id, f"checkpoint.{name}", note["path"])

    def close(self) -> None:
        self._end("FINISHED")

    def _end(self, status: str) -> None:
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self._end_unfinished)
        self.client.set_terminated(self.run_id, status)

    def _end_unfinished(self) -> None:
        try:
            self._end("FAILED")
        except Exception:  # at exit: nothing left to tell
            pass
