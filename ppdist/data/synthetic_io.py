"""Atomic creation of a synthetic data set directory, shared by every generator.

A generator describes its data set (``summary``) and writes it into a temporary directory
(``write(tmp) -> extra summary entries``); ``build_atomically`` skips the work when
``out_dir/train.txt`` already exists, renames the temporary directory into place so a
half-written data set is never visible, and falls back to a concurrent writer's result.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, Mapping, Optional


def count_lines(path: str) -> int:
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip())


def move_into_place(tmp: str, out_dir: str) -> None:
    """Rename ``tmp`` to ``out_dir``; an existing empty ``out_dir`` is replaced."""
    if os.path.isdir(out_dir) and not os.listdir(out_dir):
        try:
            os.rmdir(out_dir)
        except OSError:
            pass
    elif os.path.exists(out_dir):
        if os.path.exists(os.path.join(out_dir, "train.txt")):
            raise FileExistsError(out_dir)  # a concurrent generator won; caller falls back
        raise FileExistsError(
            f"{out_dir} exists, is not empty and holds no train.txt; remove it or choose another --out"
        )
    os.rename(tmp, out_dir)


def skipped_summary(summary: Dict[str, Any], out_dir: str) -> Dict[str, Any]:
    val_txt = os.path.join(out_dir, "val.txt")
    summary.update(
        skipped=True,
        num_train=count_lines(os.path.join(out_dir, "train.txt")),
        num_val=count_lines(val_txt) if os.path.exists(val_txt) else 0,
    )
    return summary


def build_atomically(
    out_dir: str,
    summary: Dict[str, Any],
    num_train: int,
    num_val: int,
    write: Callable[[str], Optional[Mapping[str, Any]]],
) -> Dict[str, Any]:
    """Run ``write(tmp)`` unless ``out_dir`` holds a data set; return the completed summary."""
    if num_train < 0 or num_val < 0:
        raise ValueError("num_train and num_val must be >= 0")
    train_txt = os.path.join(out_dir, "train.txt")
    if os.path.exists(train_txt):
        return skipped_summary(summary, out_dir)
    start = time.perf_counter()
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        extra = write(tmp) or {}
        os.chmod(tmp, 0o755)
        move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(train_txt):  # another process finished first: use its data
            return skipped_summary(summary, out_dir)
        raise
    seconds = time.perf_counter() - start
    total = num_train + num_val
    summary.update(skipped=False, num_train=num_train, num_val=num_val, **extra)
    summary.update(
        seconds=round(seconds, 3), images_per_second=round(total / seconds, 1) if seconds > 0 else None
    )
    return summary
