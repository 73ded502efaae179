"""Paddle weights for ppdist models: ``pdparams`` reads ``.pdparams`` / ``.pdema`` files without Paddle
(a restricted unpickler), ``naming`` gives each ppdist tensor its Paddle name(s), ``convert`` builds
a model's state dict from a Paddle one and reports what did not fit."""

from ppdist.convert.weights.convert import (
    ConversionReport,
    convert_state_dict,
    load_paddle_weights,
    paddle_key_table,
)
from ppdist.convert.weights.pdparams import is_paddle_weights, load_pdparams

__all__ = [
    "ConversionReport",
    "convert_state_dict",
    "is_paddle_weights",
    "load_paddle_weights",
    "load_pdparams",
    "paddle_key_table",
]
