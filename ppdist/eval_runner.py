"""Evaluate saved weights on the config's Eval set (the body of ``tools/eval.py``)."""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Dict, Mapping, Optional

import torch

from ppdist.components import build_metric, build_model, build_postprocess, class_vocabulary
from ppdist.data.build import build_dataloader, set_min_image_size
from ppdist.engine import checkpoint as ckpt
from ppdist.engine.checkpoint import weights_source
from ppdist.engine.dist import DistEnv
from ppdist.engine.finite_state import describe, nonfinite_tensors
from ppdist.engine.runtime import build_runtime
from ppdist.errors import ConfigError
from ppdist.modeling.input_size import min_input_size
from ppdist.registry import METRICS

logger = logging.getLogger("ppdist")


def set_picture_options(
    config: Dict[str, Any],
    output_dir: Optional[str],
    iou: Optional[float] = None,
    score: Optional[float] = None,
) -> None:
    """``tools/eval.py --output_dir DIR [--iou X] [--score Y]`` in ``config["Metric"]``: a metric that
    writes files of its own (detection: ``bbox.json``) writes them into ``output_dir``; ``iou`` /
    ``score`` set the detection confusion matrix's matching (``COCOMetric.confusion_iou`` /
    ``confusion_score``). ``ConfigError`` for a metric without a confusion matrix, or no ``output_dir``."""
    metric = config["Metric"]
    accepted = inspect.signature(METRICS.get(metric["name"])).parameters
    if output_dir and "output_dir" in accepted:
        metric["output_dir"] = output_dir
    for flag, key, value in (("--iou", "confusion_iou", iou), ("--score", "confusion_score", score)):
        if value is None:
            continue
        if key not in accepted or not output_dir:
            raise ConfigError(
                f"{flag} sets the detection confusion matrix (COCOMetric) of --output_dir; "
                + (f"this config's Metric is {metric['name']}" if output_dir else "--output_dir is not set")
            )
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{flag} must be between 0 and 1, got {value}")
        metric[key] = float(value)


def warn_if_not_finite(model: torch.nn.Module, source: str) -> None:
    """One warning line when the weights loaded from ``source`` hold NaN/Inf values (its metrics
    then come from a broken model)."""
    found = nonfinite_tensors(model.state_dict())
    if found:
        logger.warning(
            "%s is not finite: %s; its metrics are those of a broken model", source, describe(found)
        )


def evaluate_checkpoint(
    config: Mapping[str, Any],
    env: DistEnv,
    pictures_dir: Optional[str] = None,
    on_metrics: Optional[Callable[[Dict[str, float]], None]] = None,
) -> Dict[str, float]:
    """Metrics of ``Global.checkpoints`` (or ``pretrained_model``); EMA weights when saved. With
    ``pictures_dir``, the metric's pictures of the evaluation are drawn there (rank 0), after
    ``on_metrics(metrics)`` (the tool prints them first, so a failed drawing does not lose them)."""
    glob = config["Global"]
    source = weights_source(glob)
    if not source or source == "auto":
        raise ConfigError("tools/eval.py needs the weights: -o Global.checkpoints=path/to/best_accuracy")
    if not config.get("Eval"):
        raise ConfigError("missing required section Eval")
    runtime = build_runtime(glob, env.device)
    model = build_model(config)
    data, source = ckpt.load_across_ranks(source, env)  # also when only some nodes have the file
    ckpt.load_inference_weights(model, data, source, class_vocabulary(config))
    warn_if_not_finite(model, source)
    if "metrics" in data:
        logger.info("metrics stored in the checkpoint: %s", data["metrics"])
    model = runtime.place(model)
    loader = build_dataloader(config, "Eval", "eval", env.rank, env.world_size, env.device.type)
    set_min_image_size(loader, min_input_size(model))  # a too-small image is a named bad sample
    evaluator = runtime.evaluator(loader, build_postprocess(config), build_metric(config), env)
    metrics = evaluator.run(model)
    logger.info("eval: %d process(es), fps %.2f", env.world_size, evaluator.last_fps)
    if on_metrics is not None:
        on_metrics(metrics)
    if pictures_dir:
        evaluator.draw_pictures(pictures_dir)
    return metrics
