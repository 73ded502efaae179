"""Evaluate saved weights on the config's Eval set (the body of ``tools/eval.py``)."""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional

import torch

from ppdist.components import build_metric, build_model, build_postprocess
from ppdist.data.build import build_dataloader
from ppdist.engine import checkpoint as ckpt
from ppdist.engine.amp import make_autocast
from ppdist.engine.checkpoint import weights_source
from ppdist.engine.device_settings import apply_backend_settings, channels_last
from ppdist.engine.dist import DistEnv
from ppdist.engine.evaluator import Evaluator
from ppdist.errors import ConfigError

logger = logging.getLogger("ppdist")


def evaluate_checkpoint(
    config: Mapping[str, Any], env: DistEnv, pictures_dir: Optional[str] = None
) -> Dict[str, float]:
    """Metrics of ``Global.checkpoints`` (or ``pretrained_model``); EMA weights when saved. With
    ``pictures_dir``, the metric's pictures of the evaluation are drawn there (rank 0)."""
    glob = config["Global"]
    source = weights_source(glob)
    if not source or source == "auto":
        raise ConfigError("tools/eval.py needs the weights: -o Global.checkpoints=path/to/best_accuracy")
    if not config.get("Eval"):
        raise ConfigError("missing required section Eval")
    apply_backend_settings(glob, env.device)
    model = build_model(config)
    data, source = ckpt.load_across_ranks(source, env)  # also when only some nodes have the file
    ckpt.load_inference_weights(model, data, source)
    if "metrics" in data:
        logger.info("metrics stored in the checkpoint: %s", data["metrics"])
    model.to(env.device)
    memory_nhwc = channels_last(glob, env.device)
    if memory_nhwc:
        model = model.to(memory_format=torch.channels_last)
    loader = build_dataloader(config, "Eval", "eval", env.rank, env.world_size, env.device.type)
    autocast, _ = make_autocast(glob, env.device)
    evaluator = Evaluator(loader, build_postprocess(config), build_metric(config), env, autocast, memory_nhwc)
    metrics = evaluator.run(model)
    logger.info("eval: %d process(es), fps %.2f", env.world_size, evaluator.last_fps)
    if pictures_dir:
        evaluator.draw_pictures(pictures_dir)
    return metrics
