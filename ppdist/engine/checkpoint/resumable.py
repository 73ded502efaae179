"""Whether a training checkpoint can continue this run: its classes, its model and its data set
are checked before anything is loaded, each refusal saying what to do instead."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from torch import nn

from ppdist.engine.checkpoint.classes import CLASSES_KEY, check_classes, class_count_hint
from ppdist.engine.checkpoint.weights import mismatch_summary
from ppdist.engine.position import Layout, RunPosition
from ppdist.errors import CheckpointError


def check_resumable(
    state: Mapping[str, Any],
    source: str,
    model: nn.Module,
    classes: Optional[Mapping[str, Any]],
    position: RunPosition,
) -> Layout:
    """The layout ``state`` was saved with; ``CheckpointError`` when it holds weights only, was
    trained with other classes (another dictionary), for another architecture or on a training set
    of another size than ``position``'s."""
    if "optimizer" not in state or "position" not in state:
        raise CheckpointError(f"{source} holds weights only; use Global.pretrained_model to start from it")
    check_classes(state.get(CLASSES_KEY), classes, source)  # another dictionary
    misfit = mismatch_summary(model, state["model"])
    if misfit is not None:  # another task or architecture: say so before anything else
        hint = class_count_hint(model.state_dict(), state["model"], classes)
        raise CheckpointError(
            f"{source} does not fit Architecture: {misfit}{hint}; resume it with the config it was trained "
            f"with (stored in the checkpoint, and as config.yml beside it), or start from its weights "
            f"with Global.pretrained_model"
        )
    saved = position.saved_layout(state["position"])
    if saved.dataset_len != position.layout.dataset_len:
        raise CheckpointError(
            f"{source} was taken with a training set of {saved.dataset_len} samples and this run has "
            f"{position.layout.dataset_len}; resume with the same data (or start a new run from it with "
            f"Global.pretrained_model)"
        )
    return saved
