"""Where logged values go: sinks (TensorBoard, MLflow, Weights & Biases) that ``ScalarWriter``
(``trainer.writer``) fans every scalar and checkpoint out to, each failure-guarded."""

from ppdist.engine.tracking.base import GuardedSink, Sink, numeric_values
from ppdist.engine.tracking.mlflow_sink import MLflowSink
from ppdist.engine.tracking.tensorboard import TensorBoardSink
from ppdist.engine.tracking.wandb_sink import WandbSink

__all__ = ["GuardedSink", "MLflowSink", "Sink", "TensorBoardSink", "WandbSink", "numeric_values"]
