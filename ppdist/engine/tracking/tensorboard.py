"""TensorBoard scalars (``save_model_dir/tensorboard``; Paddle's VisualDL switch maps here)."""

from __future__ import annotations

import os
from typing import Any, Mapping

from ppdist.engine.tracking.base import Sink
from ppdist.errors import ConfigError


class TensorBoardSink(Sink):
    """``<prefix>/<key>`` scalars in a ``SummaryWriter`` of ``log_dir``; checkpoints are not its business."""

    label = "tensorboard"

    def __init__(self, log_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415  (heavy; loaded when a run asks)

        try:
            os.makedirs(log_dir, exist_ok=True)
        except OSError as exc:
            what = (
                "is a file, not a folder"
                if os.path.isfile(log_dir)
                else f"cannot be made ({exc.strerror or exc})"
            )
            raise ConfigError(
                f"Global.use_tensorboard: TensorBoard's folder {log_dir} {what}; move it away, or turn "
                f"Global.use_tensorboard off"
            ) from exc
        self.writer: Any = SummaryWriter(log_dir=log_dir)

    def log_scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def close(self) -> None:
        self.writer.close()
