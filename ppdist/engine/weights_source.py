"""Which weights a run that does not train uses (evaluation, export, inference, benchmark)."""

from __future__ import annotations

from typing import Any, Mapping, Optional


def weights_source(glob: Mapping[str, Any]) -> Optional[str]:
    """``Global.checkpoints``, else ``Global.pretrained_model`` (a path, a prefix or ``auto``; None
    or empty when neither is set). Loaded with ``ppdist.engine.checkpoint``."""
    return glob["checkpoints"] or glob["pretrained_model"]
