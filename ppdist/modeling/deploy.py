"""Deploy-time re-parameterisation (RepVgg branch folding) of a trained model."""

from __future__ import annotations

from torch import nn


def convert_to_deploy(model: nn.Module) -> nn.Module:
    """Put ``model`` in eval mode and call ``convert_to_deploy()`` on every submodule that has it.

    The conversion uses BatchNorm running statistics, so the result matches the eval-mode
    outputs of the original. The model is modified in place and returned.
    """
    model.eval()
    for module in list(model.modules()):
        if module is model:
            continue
        convert = getattr(module, "convert_to_deploy", None)
        if callable(convert):
            convert()
    return model
