"""An eval-mode model wrapped into what its exported graph computes: the wrapper and the graph of
the config's task (``ppdist.tasks``). A composite model (``Architecture.Models``) is deployed as its
deployed sub-model (``ppdist.export.submodels``)."""

from __future__ import annotations

from typing import Any, Mapping, Tuple

from torch import nn

from ppdist.export.submodels import deployed_part
from ppdist.tasks import GraphSpec, get_task


def build_deploy(
    model: nn.Module, config: Mapping[str, Any], exclude_nms: bool = False
) -> Tuple[nn.Module, GraphSpec]:
    """The wrapper for ``config``'s task around the eval-mode ``model``, and its graph spec; for a
    composite model, around its deployed sub-model (a plain model of its own config).
    ``exclude_nms`` leaves detection's NMS out of the graph (other tasks have none)."""
    model, config = deployed_part(model, config)
    task = get_task(config)
    model.eval()
    return task.build_deploy(model, config, exclude_nms)
