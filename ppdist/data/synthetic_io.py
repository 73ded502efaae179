"""Atomic creation of a synthetic data set directory, shared by every generator.

A generator describes its data set (``summary``) and writes it into a temporary directory
(``write(tmp) -> extra summary entries``); ``build_atomically`` skips the work when
``out_dir/train.txt`` already exists, renames the temporary directory into place so a
half-written data set is never visible, and falls back to a concurrent writer's result. The
generator's settings are recorded beside the data (``synthetic_settings.json``); a data set that
is reused although it was drawn with other settings says so in its summary (``differs``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, Mapping, Optional

from ppdist.errors import ConfigError
from ppdist.utils import strict_json

SETTINGS_FILE = "synthetic_settings.json"


class SyntheticSettingError(ConfigError):
    """A generator setting out of its range: ``key`` (the generator's keyword) and ``detail``
    (what it must be, what it got). Callers name the setting their way: ``Global.synthetic_data.<key>``
    or the tool's ``--<key>`` (``str()``: ``<key> ...``)."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"{key} {detail}")
        self.key, self.detail = key, detail


def check_setting(ok: bool, key: str, expected: str, value: Any) -> None:
    """``SyntheticSettingError`` naming ``key`` unless ``ok``."""
    if not ok:
        raise SyntheticSettingError(key, f"must be {expected}, got {value!r}")


def is_int(value: Any) -> bool:
    """A whole number that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_lengths(min_len: Any, max_len: Any) -> None:
    """Text lengths: ``1 <= min_len <= max_len``, whole numbers."""
    check_setting(is_int(min_len) and min_len >= 1, "min_len", "a whole number >= 1", min_len)
    check_setting(
        is_int(max_len) and max_len >= min_len, "max_len", f"a whole number >= min_len ({min_len})", max_len
    )


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


def _plain(value: Any) -> Any:
    """A JSON value for a setting json cannot write (a numpy scalar or array, a path)."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


def recorded_settings(out_dir: str) -> Optional[Dict[str, Any]]:
    """The settings a data set was drawn with, or None for a folder without a readable record."""
    try:
        with open(os.path.join(out_dir, SETTINGS_FILE), encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def skipped_summary(summary: Dict[str, Any], out_dir: str, requested: Mapping[str, Any]) -> Dict[str, Any]:
    """``summary`` for a reused data set: its counts, and ``differs`` (key -> {found, asked}) for
    every requested setting it was not drawn with (only the counts where it has no record)."""
    val_txt = os.path.join(out_dir, "val.txt")
    summary.update(
        skipped=True,
        num_train=count_lines(os.path.join(out_dir, "train.txt")),
        num_val=count_lines(val_txt) if os.path.exists(val_txt) else 0,
    )
    found = recorded_settings(out_dir)
    if found is None:
        found = {key: summary[key] for key in ("num_train", "num_val")}
    differs = {
        key: {"found": found[key], "asked": value}
        for key, value in requested.items()
        if key in found and found[key] != value
    }
    if differs:
        summary["differs"] = differs
    return summary


def build_atomically(
    out_dir: str,
    summary: Dict[str, Any],
    num_train: int,
    num_val: int,
    write: Callable[[str], Optional[Mapping[str, Any]]],
    settings: Mapping[str, Any],
) -> Dict[str, Any]:
    """Run ``write(tmp)`` unless ``out_dir`` holds a data set; return the completed summary.

    ``settings``: the generator's options (all but ``out_dir`` and the counts), recorded with the
    data and compared with the record when an existing data set is reused."""
    check_setting(is_int(num_train) and num_train >= 1, "num_train", "a whole number >= 1", num_train)
    check_setting(is_int(num_val) and num_val >= 1, "num_val", "a whole number >= 1", num_val)
    requested = json.loads(
        strict_json.dumps({**settings, "num_train": num_train, "num_val": num_val}, default=_plain)
    )
    train_txt = os.path.join(out_dir, "train.txt")
    if os.path.exists(train_txt):
        return skipped_summary(summary, out_dir, requested)
    start = time.perf_counter()
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        extra = write(tmp) or {}
        with open(os.path.join(tmp, SETTINGS_FILE), "w", encoding="utf-8") as handle:
            strict_json.dump(requested, handle, indent=1, sort_keys=True)
        os.chmod(tmp, 0o755)
        move_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(train_txt):  # another process finished first: use its data
            return skipped_summary(summary, out_dir, requested)
        raise
    seconds = time.perf_counter() - start
    total = num_train + num_val
    summary.update(skipped=False, num_train=num_train, num_val=num_val, **extra)
    summary.update(
        seconds=round(seconds, 3), images_per_second=round(total / seconds, 1) if seconds > 0 else None
    )
    return summary
