"""Result files of ``tools/infer.py``, by the task's writer (``ppdist.tasks``): rec ``results.txt``,
det ``bbox.json`` + drawn images, seg palette PNGs + overlays, table ``results.jsonl`` + HTML +
pictures with the cell boxes. Each writer takes results batch by batch and ``close()`` finishes."""

from __future__ import annotations

import os
from typing import Any, Mapping

from ppdist.tasks import get_task


def build_writer(task: str, output_dir: str, info: Mapping[str, Any], draw_threshold: float = 0.5) -> Any:
    """The writer of ``task`` into ``output_dir`` (created)."""
    os.makedirs(output_dir, exist_ok=True)
    return get_task(task).writer(output_dir, info, draw_threshold)
