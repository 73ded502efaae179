"""Test helpers for the trackers: read an offline W&B run's records, and parse ppdist's log lines."""

from __future__ import annotations

import glob
import json
import os
import re
import struct
import time
from typing import Any, Dict, Iterator, List, Tuple

BLOCK = 32768  # the LevelDB log format W&B's .wandb file uses: 32 KiB blocks of framed chunks
FILE_HEADER = 7  # ":W&B", a 2-byte magic and a version byte
CHUNK_HEADER = 7  # crc32 (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> Iterator[Tuple[int, bytes]]:
    pos = FILE_HEADER
    while pos + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < CHUNK_HEADER:  # the block's tail is padding
            pos += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        if kind == 0 or pos + CHUNK_HEADER + length > len(data):  # the end, or a chunk still being written
            break
        yield kind, data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length


def offline_wandb(monkeypatch: Any, folder: str) -> None:
    """W&B offline and quiet, its caches and settings in ``folder`` (not the home directory)."""
    for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"), ("WANDB_CONSOLE", "off")):
        monkeypatch.setenv(name, value)
    for name in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(name, os.path.join(folder, name.lower()))


def wandb_records(run_dir: str, timeout: float = 300.0) -> List[Any]:
    """The protobuf records of the offline run in ``run_dir`` (``.../wandb/offline-run-*``).

    W&B's service writes the file on its own after ``run.finish()`` returns (a loaded machine can
    still be writing it), so this waits up to ``timeout`` seconds for the run's final ``exit``
    record before it returns the records.
    """
    deadline = time.monotonic() + timeout
    while True:
        records = _read_wandb_records(run_dir)
        kinds = [record.WhichOneof("record_type") for record in records]
        if kinds and kinds[-1] == "exit":
            return records
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the offline run in {run_dir} has no final exit record after {timeout} s: {kinds}"
            )
        time.sleep(0.2)


def _read_wandb_records(run_dir: str) -> List[Any]:
    from wandb.proto import wandb_internal_pb2  # noqa: PLC0415

    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    with open(path, "rb") as handle:
        data = handle.read()
    if len(data) < FILE_HEADER:
        return []
    assert data[:4] == b":W&B", path
    records, pending = [], b""
    for kind, chunk in _chunks(data):
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history(records: List[Any]) -> List[Dict[str, Any]]:
    """The logged rows: ``{key: value}`` per ``run.log`` call."""
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append({_key(item): json.loads(item.value_json) for item in record.history.item})
    return rows


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def wandb_config(records: List[Any]) -> Dict[str, Any]:
    """The run's config: given to ``wandb.init`` (the run record), then updated."""
    config: Dict[str, Any] = {}
    for record in records:
        kind = record.WhichOneof("record_type")
        updates = (
            record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        )
        for item in updates:
            config[_key(item)] = json.loads(item.value_json)
    return config


def wandb_artifacts(records: List[Any]) -> List[Any]:
    return [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]


TRAIN_LINE = re.compile(r"global_step: (\d+), lr: ([\d.e-]+), (.*?), avg_reader_cost")
EVAL_LINE = re.compile(r"cur metric, (.*), fps:")


def _pairs(text: str) -> Dict[str, float]:
    return {k: float(v) for k, v in (pair.split(": ") for pair in text.split(", "))}


def train_log_values(log_text: str) -> Dict[int, Dict[str, float]]:
    """``{global_step: {lr, loss, ...}}`` of the training lines of a log (6 decimals)."""
    found = {}
    for step, lr, rest in TRAIN_LINE.findall(log_text):
        found[int(step)] = dict(_pairs(rest), lr=float(lr))
    return found


def eval_log_values(log_text: str) -> List[Dict[str, float]]:
    """The ``cur metric`` lines of a log, in order."""
    return [_pairs(text) for text in EVAL_LINE.findall(log_text)]
