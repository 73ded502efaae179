"""Synthetic data at a recipe's real image size for the input-pipeline measurement
(``tools/benchmark.py --input_pipeline --synthetic``): the config keeps its transforms, loaders and
batch transforms; only where the images come from changes. Each task says what its set is
(``Task.benchmark_data``): det COCO-like JPEGs of 640x480 in COCO layout, seg Cityscapes-sized
2048x1024 JPEGs with PNG labels, rec rendered text lines in LMDBs, table rendered tables in
PubTabNet's jsonl layout (the recipe's teacher-forced step runs ``max_text_length + 2`` decoder
steps whatever the table).
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, Mapping

from ppdist.tasks import get_task

SECTIONS = {"Train": "train", "Eval": "val"}


def with_synthetic_data(config: Mapping[str, Any], root: str, images: int) -> Dict[str, Any]:
    """``config`` reading a synthetic set of ``images`` train and val images at the recipe's real
    size (drawn under ``root`` the first time, seed 0)."""
    task = get_task(config)
    if task.benchmark_data is None:
        raise ValueError(f"no synthetic benchmark data for task {task.name!r}")
    data_dir = os.path.abspath(os.path.join(root, task.benchmark_data.folder(images)))
    task.benchmark_data.generate(data_dir, images)
    config = copy.deepcopy(dict(config))
    for section, split in SECTIONS.items():
        if config.get(section):
            old = config[section]["dataset"]
            config[section]["dataset"] = task.benchmark_data.dataset_entry(data_dir, split, old)
    return config
