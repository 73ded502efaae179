"""Which suite a YAML config comes from: ppdist/PaddleOCR, PaddleDetection or PaddleSeg."""

from __future__ import annotations

from typing import Any, Dict

from ppdist.config import BASE_KEY, SECTIONS
from ppdist.convert.configs.common import PADDLEDET, PADDLEOCR, PADDLESEG, read_paddle_yaml
from ppdist.convert.configs.paddledetection import load_det_yaml
from ppdist.errors import ConfigError

PPDIST = "ppdist"  # ppdist's schema, which PaddleOCR's configs already use
UNKNOWN = "unknown"

# Top-level keys only PaddleDetection configs have (its sections and run-wide keys).
DET_MARKERS = frozenset(
    (
        "architecture",
        "TrainReader",
        "EvalReader",
        "TestReader",
        "TrainDataset",
        "EvalDataset",
        "TestDataset",
        "LearningRate",
        "OptimizerBuilder",
        "epoch",
        "snapshot_epoch",
        "log_iter",
        "pretrain_weights",
        "weights",
        "worker_num",
        "metric",
        "save_dir",
        "norm_type",
        "use_ema",
        "num_classes",
        "depth_mult",
        "width_mult",
    )
)
# Top-level keys only PaddleSeg configs have.
SEG_MARKERS = frozenset(
    (
        "_base_",
        "model",
        "train_dataset",
        "val_dataset",
        "test_dataset",
        "lr_scheduler",
        "iters",
        "batch_size",
        "test_config",
        "loss",
        "optimizer",
        "distill_loss",
    )
)


def suite_of(data: Dict[str, Any]) -> str:
    """The suite of an already read top-level mapping (bases not resolved)."""
    keys = set(data)
    if keys & SEG_MARKERS:
        return PADDLESEG
    if keys & DET_MARKERS:
        return PADDLEDET
    if keys <= set(SECTIONS) | {BASE_KEY} or {"Global", "Architecture"} <= keys:
        return PPDIST  # a PaddleOCR config may add sections of its own (wandb, ...)
    return UNKNOWN


def detect_suite(path: str) -> str:
    """``PPDIST``, ``PADDLEDET``, ``PADDLESEG`` or ``UNKNOWN`` for the config file ``path``.

    A file that cannot be read is reported as ``PPDIST`` so that ppdist's own loader gives its
    usual error. A PaddleDetection child whose own keys are all unrecognised (e.g. only
    ``_BASE_`` plus custom keys) is recognised through its bases.
    """
    try:
        data = read_paddle_yaml(path)
    except ConfigError:
        return PPDIST
    suite = suite_of(data)
    if suite == UNKNOWN and BASE_KEY in data:
        try:
            merged = load_det_yaml(path)
        except ConfigError:
            return UNKNOWN
        if suite_of(merged) == PADDLEDET:
            return PADDLEDET
    return suite


def is_paddle_config(path: str) -> bool:
    """True for a PaddleDetection or PaddleSeg config (which ppdist converts on load)."""
    return detect_suite(path) in (PADDLEDET, PADDLESEG)


__all__ = [
    "PPDIST",
    "UNKNOWN",
    "PADDLEDET",
    "PADDLESEG",
    "PADDLEOCR",
    "detect_suite",
    "is_paddle_config",
    "suite_of",
]
