"""Checkpoints: the files (``io``), the weights they give a model (``weights``) and the record of what
the model's classes mean (``classes``).

``from ppdist.engine import checkpoint as ckpt`` gives them all: ``ckpt.save_atomic``,
``ckpt.load_across_ranks``, ``ckpt.load_inference_weights``, ...
"""

from ppdist.engine.checkpoint.classes import CLASSES_KEY, check_classes, class_count_hint
from ppdist.engine.checkpoint.io import (
    PADDLE_KEY,
    PADDLE_SUFFIX,
    SUFFIX,
    checkpoint_path,
    load_across_ranks,
    load_file,
    save_atomic,
    saved_global_step,
)
from ppdist.engine.checkpoint.weights import (
    converted_paddle_weights,
    extract_model_state,
    inference_weights,
    load_inference_weights,
    load_initial_weights,
    load_matching_weights,
    load_pretrained,
    load_stage_pretrained,
    mismatch_summary,
    upgrade_legacy_keys,
    weights_for,
    weights_source,
    write_converted,
)

__all__ = [
    "CLASSES_KEY",
    "PADDLE_KEY",
    "PADDLE_SUFFIX",
    "SUFFIX",
    "check_classes",
    "checkpoint_path",
    "class_count_hint",
    "converted_paddle_weights",
    "extract_model_state",
    "inference_weights",
    "load_across_ranks",
    "load_file",
    "load_inference_weights",
    "load_initial_weights",
    "load_matching_weights",
    "load_pretrained",
    "load_stage_pretrained",
    "mismatch_summary",
    "save_atomic",
    "saved_global_step",
    "upgrade_legacy_keys",
    "weights_for",
    "weights_source",
    "write_converted",
]
