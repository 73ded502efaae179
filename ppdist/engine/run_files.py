"""What a training run leaves in its ``save_model_dir``: the checkpoints that make the folder a run's
(``existing_run_files``)."""

from __future__ import annotations

import os
from typing import List

RUN_FILES = ("latest.pt", "best_accuracy.pt")


def existing_run_files(folder: str) -> List[str]:
    """The checkpoints of a run (``latest.pt``, ``best_accuracy.pt``) that ``folder`` holds."""
    return [name for name in RUN_FILES if os.path.isfile(os.path.join(folder, name))]
