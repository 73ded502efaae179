"""The input pipeline's CPU cost per image, transform by transform (``tools/benchmark.py
--input_pipeline``).

One thread, set up as a loader worker is (``WorkerInit``: torch 1 thread, OpenCV sequential by
default), runs what one loader worker runs for a split (``seeded_sample``: no saving of the RNG streams per sample, which only loading in
the main process does): the dataset's read, each sample transform, the dataset's output layout
(``finish``), each batch transform (its time divided by the batch size) and the collate. Times are
the thread's CPU time (``time.thread_time``), so other load on the machine barely moves them.
Work the loader leaves to the device (e.g. the normalisation) is named and not timed. The total is
compared with a plain ``cv2.imdecode`` of the same encoded image bytes.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Mapping, Sequence

import cv2
import numpy as np
import torch

from ppdist.data.build import WorkerInit, build_input_pipeline
from ppdist.utils.rng import kept_cpu_rng_streams

Clock = Dict[str, float]


def cpu_time() -> float:
    return time.thread_time()


class Timed:
    """``op`` that adds its CPU time to ``clock[name]`` on each call (``batch_op`` kept)."""

    def __init__(self, op: Callable[..., Any], name: str, clock: Clock) -> None:
        self.op, self.name, self.clock = op, name, clock
        self.batch_op = bool(getattr(op, "batch_op", False))

    def __call__(self, *args: Any) -> Any:
        start = cpu_time()
        try:
            return self.op(*args)
        finally:
            self.clock[self.name] += cpu_time() - start


def op_label(op: Any, position: int, where: str) -> str:
    """A row name: the op's class, its place in the config when a name repeats."""
    return f"{type(op).__name__} ({where}[{position}])"


@contextmanager
def as_loader_worker(config: Mapping[str, Any], section: str) -> Iterator[None]:
    """This thread set up as ``config[section]``'s loader workers are (``WorkerInit``: one torch
    thread, OpenCV's threads, process settings) for the block; the thread counts restored after."""
    threads, cv_threads = torch.get_num_threads(), cv2.getNumThreads()
    cv2_threads = int(config[section]["loader"].get("cv2_num_threads", 0))
    with kept_cpu_rng_streams():
        WorkerInit(int(config["Global"]["seed"]), 0, cv2_threads)(0)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        cv2.setNumThreads(cv_threads)


def encoded_image(dataset: Any, index: int) -> bytes:
    """Sample ``index``'s image file bytes as stored (what a plain decode reads)."""
    image_file = getattr(dataset, "image_file", None)
    if image_file is not None:  # a dataset whose read() decodes (segmentation)
        with open(image_file(index), "rb") as handle:
            return handle.read()
    raw = dataset.read(index)["image"]
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise TypeError(f"{type(dataset).__name__}.read gives no encoded image bytes to compare with")
    return bytes(raw)


def plain_decode_ms(blobs: Sequence[bytes], passes: int = 1) -> float:
    """CPU ms per image of ``cv2.imdecode`` (colour) of ``blobs`` after one untimed decode: the
    fastest of ``passes`` passes."""
    arrays = [np.frombuffer(blob, dtype=np.uint8) for blob in blobs]
    cv2.imdecode(arrays[0], cv2.IMREAD_COLOR)
    best = float("inf")
    for _ in range(max(1, passes)):
        start = cpu_time()
        for array in arrays:
            cv2.imdecode(array, cv2.IMREAD_COLOR)
        best = min(best, cpu_time() - start)
    return best * 1000 / len(arrays)


def _instrument(dataset: Any, collate: Any, clock: Clock) -> List[str]:
    """Wrap the dataset's read/finish, its transforms and the batch transforms with ``Timed``;
    returns the row names in pipeline order."""
    rows = ["read"]
    dataset.read = Timed(dataset.read, "read", clock)
    ops = []
    for i, op in enumerate(dataset.ops):
        rows.append(op_label(op, i, "transforms"))
        ops.append(Timed(op, rows[-1], clock))
    dataset.ops = ops
    rows.append("finish (output layout)")
    dataset.finish = Timed(dataset.finish, rows[-1], clock)
    batch_ops = []
    for i, op in enumerate(collate.batch_ops):
        rows.append(op_label(op, i, "batch_transforms"))
        batch_ops.append(Timed(op, rows[-1], clock))
    collate.batch_ops = batch_ops
    return rows


def device_ops(collate: Any) -> List[str]:
    """Names of the ops the loader leaves to the device (none before issue 27)."""
    transform = getattr(collate, "device_transform", None)
    return list(getattr(transform, "sources", ())) if transform is not None else []


def profile_split(config: Mapping[str, Any], section: str, images: int, passes: int = 1) -> Dict[str, Any]:
    """CPU ms per image of each step of ``config[section]``'s pipeline over its first
    ``images`` samples (whole batches of the loader's batch size; one untimed batch first). With
    ``passes`` > 1 the same samples (same random draws) go through again and the pass with the
    smallest total is reported (the least disturbed by other load), the plain decode likewise."""
    mode = "train" if section == "Train" else "eval"
    dataset, collate = build_input_pipeline(config, section, mode)
    batch_size = int(config[section]["loader"]["batch_size_per_card"])
    count = min(len(dataset), max(images, 1))
    batches = [list(range(i, min(i + batch_size, count))) for i in range(0, count, batch_size)]
    clock: Clock = defaultdict(float)
    rows = _instrument(dataset, collate, clock)
    seed = int(config["Global"]["seed"])
    batch_rows = [name for name in rows if "batch_transforms[" in name]

    def run(indices: List[int]) -> Dict[str, float]:
        start = cpu_time()
        samples = [dataset.seeded_sample(index, 1, seed) for index in indices]  # as in a worker
        loaded = cpu_time()
        collate(samples)
        done = cpu_time()
        return {"samples": loaded - start, "collate": done - loaded}

    with as_loader_worker(config, section), kept_cpu_rng_streams():
        run(batches[0])  # warm-up: imports, allocator, file cache
        best: Dict[str, Any] = {}
        for _ in range(max(1, passes)):
            clock.clear()
            wall = time.perf_counter()
            spent = {"samples": 0.0, "collate": 0.0}
            for indices in batches:
                for key, value in run(indices).items():
                    spent[key] += value
            wall = time.perf_counter() - wall
            if not best or sum(spent.values()) < sum(best["spent"].values()):
                best = {"spent": spent, "wall": wall, "clock": dict(clock)}
        decode = plain_decode_ms([encoded_image(dataset, i) for i in range(count)], passes)
    spent, wall = best["spent"], best["wall"]
    per_image = {name: best["clock"].get(name, 0.0) * 1000 / count for name in rows}
    sample_steps = sum(v for k, v in per_image.items() if k not in batch_rows)
    per_image["other (seeding, bookkeeping)"] = spent["samples"] * 1000 / count - sample_steps
    per_image["collate (stacking)"] = spent["collate"] * 1000 / count - sum(
        per_image[name] for name in batch_rows
    )
    total = (spent["samples"] + spent["collate"]) * 1000 / count
    return {
        "section": section,
        "images": count,
        "batch_size": batch_size,
        "passes": max(1, passes),
        "ms_per_image": per_image,
        "total_ms": total,
        "wall_ms": wall * 1000 / count,
        "decode_ms": decode,
        "ratio": total / decode if decode > 0 else float("inf"),
        "on_device": device_ops(collate),
    }


def markdown_table(split: Mapping[str, Any]) -> str:
    """One split as a markdown table: ms/image per step, total, plain decode, ratio."""
    passes = split.get("passes", 1)
    lines = [
        f"{split['section']}: {split['images']} images, batch {split['batch_size']} (CPU ms per image, "
        f"one thread{f', best of {passes} passes' if passes > 1 else ''})",
        "",
        "| step | ms/image |",
        "|---|---:|",
    ]
    digits = 3 if split["total_ms"] < 1 else 2  # text lines: tens of microseconds
    for name, value in split["ms_per_image"].items():
        lines.append(f"| {name} | {value:.{digits}f} |")
    for name in split["on_device"]:
        lines.append(f"| {name} | on the device (not counted) |")
    lines += [
        f"| **total** | **{split['total_ms']:.{digits}f}** |",
        f"| plain decode (`cv2.imdecode`, same bytes) | {split['decode_ms']:.{digits}f} |",
        f"| **ratio total / decode** | **{split['ratio']:.2f}** |",
    ]
    return "\n".join(lines)


def run_input_pipeline(
    config: Mapping[str, Any], images: int, sections: Sequence[str], passes: int = 1
) -> Dict[str, Any]:
    """``profile_split`` of each of ``sections`` the config has."""
    return {
        section: profile_split(config, section, images, passes) for section in sections if config.get(section)
    }
