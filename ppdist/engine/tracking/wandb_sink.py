"""Weights & Biases: the run's config, its scalars against ``global_step``, its checkpoints as
versions of one ``model-<run id>`` artifact aliased by checkpoint name (PaddleOCR's scheme)."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from ppdist.engine.tracking.base import Sink

logger = logging.getLogger("ppdist")
STEP_KEY = "global_step"


class WandbSink(Sink):
    """``wandb.init(**init_kwargs, config=config)``; ``run_id`` (of a resumed training) is
    continued unless ``init_kwargs`` names an ``id``. Scalars are logged with ``global_step`` as
    their x axis (so a resumed run that logs earlier steps again loses nothing). ``checkpoints``:
    ``reference`` (the file's path and checksum, no upload), ``artifact`` (uploaded) or ``none``;
    ``best_name`` also gets the alias ``best`` and the metrics of its evaluation as metadata."""

    label = "wandb"

    def __init__(
        self,
        init_kwargs: Mapping[str, Any],
        config: Optional[Mapping[str, Any]] = None,
        checkpoints: str = "reference",
        run_id: Optional[str] = None,
        best_name: str = "best_accuracy",
    ) -> None:
        import wandb  # noqa: PLC0415  (optional package, loaded when asked)

        self.wandb = wandb
        kwargs = dict(init_kwargs)
        if run_id and "id" not in kwargs:
            kwargs.update(id=run_id, resume=kwargs.get("resume", "allow"))
        self.run = wandb.init(config=dict(config) if config is not None else None, **kwargs)
        self.run_id = self.run.id
        self.run.define_metric(STEP_KEY)
        for prefix in ("train", "eval"):
            self.run.define_metric(f"{prefix}/*", step_metric=STEP_KEY)
        self.checkpoints, self.best_name = checkpoints, best_name
        self.last_eval: Tuple[int, Dict[str, float]] = (-1, {})
        logger.info("wandb: logging to run %s in %s", self.run_id, self.run.dir)

    def log_scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        if values:
            self.run.log({STEP_KEY: step, **{f"{prefix}/{k}": v for k, v in values.items()}})
        if prefix == "eval":
            self.last_eval = (step, dict(values))

    def log_checkpoint(self, name: str, path: str, step: int) -> None:
        if self.checkpoints == "none":
            return
        metadata: Dict[str, Any] = {"name": name, STEP_KEY: step, "path": os.path.abspath(path)}
        aliases = [name]
        if name == self.best_name:
            aliases.append("best")
            if self.last_eval[0] == step:
                metadata["metrics"] = self.last_eval[1]
        artifact = self.wandb.Artifact(f"model-{self.run_id}", type="model", metadata=metadata)
        if self.checkpoints == "artifact":
            artifact.add_file(path, name=os.path.basename(path))
        else:
            artifact.add_reference("file://" + os.path.abspath(path), name=os.path.basename(path))
        self.run.log_artifact(artifact, aliases=aliases)

    def close(self) -> None:
        self.run.finish()
