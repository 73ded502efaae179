"""Tracker hooks: MLflow and Weights & Biases beside TensorBoard, from rank 0 only.

Each hook starts its tracker's run on rank 0 before the first step and adds its sink to
``trainer.writer``, so the tracker sees exactly what TensorBoard sees (the log hook's ``train/*``
values, the evaluations' ``eval/*`` metrics) plus every checkpoint rank 0 writes; the writer ends
the run when training ends. A tracker that cannot start stops the run there with a
``TrackerError``; one that fails later is warned about and training goes on (``GuardedSink``).
The run's id is kept in checkpoints: a resumed training continues the same run.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

from ppdist.engine.hooks.base import PRIORITY_LOG, Hook
from ppdist.engine.hooks.evaluation import BEST_NAME
from ppdist.engine.tracking import MLflowSink, Sink, WandbSink
from ppdist.errors import PPDistError, TrackerError


class TrackerHook(Hook):
    """Base class: ``open_sink()`` starts the run (rank 0 only); state: the run's id."""

    priority = PRIORITY_LOG
    key = ""  # the config key that asks for the tracker, for messages

    def __init__(self, checkpoints: str = "reference") -> None:
        self.checkpoints = checkpoints
        self.run_id: Optional[str] = None
        self.sink: Optional[Sink] = None

    def open_sink(self) -> Sink:
        raise NotImplementedError

    def before_train(self) -> None:
        if not self.trainer.env.is_main:
            return
        try:
            sink = self.open_sink()
        except PPDistError:
            raise
        except Exception as exc:  # the tracker's own errors (unreachable server, bad credentials, ...)
            raise TrackerError(
                f"{self.key}: the tracker cannot start its run ({type(exc).__name__}: {exc}); fix its "
                f"settings or the connection, or turn {self.key} off"
            ) from exc
        self.sink, self.run_id = sink, sink.run_id
        self.trainer.writer.add_sink(sink)

    def state_dict(self) -> Dict[str, Any]:
        return {"run_id": self.run_id} if self.run_id else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.run_id = state.get("run_id") or None

    def save_dir(self) -> str:
        return os.path.abspath(self.trainer.save_dir or ".")


class MLflowTracker(TrackerHook):
    """``Global.mlflow``: ``settings`` of ``ppdist.config.trackers.mlflow_settings``. The tracking
    URI: the settings', else ``MLFLOW_TRACKING_URI``, else a file store in ``save_dir/mlruns``;
    the run's name: the settings', else the name of ``save_dir``. Logs the resolved config as
    params and ``config.yml``."""

    name = "mlflow"
    key = "Global.mlflow"

    def __init__(self, settings: Mapping[str, Any], checkpoints: str = "reference") -> None:
        super().__init__(checkpoints)
        self.settings = dict(settings)

    def tracking_uri(self) -> str:
        uri = self.settings.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
        return uri or os.path.join(self.save_dir(), "mlruns")

    def open_sink(self) -> Sink:
        sink = MLflowSink(
            self.tracking_uri(),
            self.settings.get("experiment_name") or "ppdist",
            run_name=self.settings.get("run_name") or os.path.basename(self.save_dir()),
            tags=self.settings.get("tags"),
            checkpoints=self.checkpoints,
            run_id=self.run_id,
            best_name=BEST_NAME,
        )
        if self.trainer.config is not None:
            sink.log_config(self.trainer.config, self.trainer.position.global_step)
        return sink


class WandbTracker(TrackerHook):
    """``Global.use_wandb`` / the ``wandb`` section: ``settings`` (``wandb.init`` keywords) of
    ``ppdist.config.trackers.wandb_settings``; ``dir`` defaults to ``save_dir`` (PaddleOCR's);
    offline with ``mode: offline`` or ``WANDB_MODE=offline``. Logs the resolved config."""

    name = "wandb"
    key = "Global.use_wandb / wandb"

    def __init__(self, settings: Mapping[str, Any], checkpoints: str = "reference") -> None:
        super().__init__(checkpoints)
        self.settings = dict(settings)

    def open_sink(self) -> Sink:
        kwargs = dict(self.settings)
        kwargs.setdefault("dir", self.save_dir())
        os.makedirs(kwargs["dir"], exist_ok=True)
        return WandbSink(
            kwargs, self.trainer.config, checkpoints=self.checkpoints, run_id=self.run_id, best_name=BEST_NAME
        )
