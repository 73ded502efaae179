"""The bare training step on the device, timed and profiled (``tools/benchmark.py --step_time``).

What the GPU probe of issue 41 measured, as a benchmark mode: ``Trainer.step`` (forward, loss,
backward, clipping, optimizer, LR, EMA, non-finite watch; no loader, no hooks) on synthetic
batches already on the device (``synthetic_step``), at a recipe's real size and per-GPU batch:

- ``measure_step_time``: the median step time and samples/s over per-step times (CUDA events),
  the host's time to issue one step from an idle device (``issue_ms``: ≈ the step time with a
  mostly idle GPU means launch-bound), and with a profile of a few steps the kernels per step,
  GPU-busy time and share, the top kernels by device time and the top ATen operators by host time.
- ``measure_size_costs``: for a multi-scale recipe, the first step at each training size
  against the next ones with cuDNN autotuning on (even positions of the size list) and off (odd
  positions): (first - next) is the one-time search a size costs, ``next`` off against on the
  steady-state price of cuDNN's heuristics; what ``Global.cudnn_warmup`` / ``cudnn_benchmark``
  are decided on.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import torch
from torch.profiler import ProfilerActivity, profile

from ppdist.benchmark.steady_state import StepMarks
from ppdist.benchmark.synthetic_step import device_batch, step_trainer
from ppdist.data.build import train_input_sizes
from ppdist.engine.device_settings import apply_backend_settings
from ppdist.engine.dist import DistEnv
from ppdist.engine.size_warmup import synthetic_batch

Size = Tuple[int, int]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _build(config: Mapping[str, Any], batch_size: int, size: Size, device: torch.device) -> Any:
    """A step trainer of ``config`` on ``device`` (nan_policy stop, as ``build_trainer``; the
    captured step with ``Global.cuda_graph``), with the cuDNN setting the recipe trains with
    (heuristics for several sizes unless warmed)."""
    trainer = step_trainer(
        config,
        batch_size,
        size,
        env=DistEnv(device=device),
        steps=2,
        nan_policy="stop",
        capture_step=bool(config["Global"].get("cuda_graph")),
    )
    apply_backend_settings(config["Global"], device, len(train_input_sizes(config)))
    return trainer


def profile_summary(prof: Any, steps: int, device: torch.device, top: int = 6) -> Dict[str, Any]:
    """Per step: the top ATen operators by host time and, on CUDA, kernels, busy time, top kernels."""
    cpu_ops = sorted(
        (e for e in prof.key_averages() if e.key.startswith("aten::")),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )[:top]
    result: Dict[str, Any] = {
        "top_cpu_ops": [
            [e.key, round(e.self_cpu_time_total / 1000 / steps, 2), e.count // steps] for e in cpu_ops
        ]
    }
    if device.type != "cuda":
        return result
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(e.time_range.elapsed_us() for e in kernels)
    by_name: Dict[str, List[float]] = {}
    for e in kernels:
        entry = by_name.setdefault(e.name[:80], [0.0, 0])
        entry[0] += e.time_range.elapsed_us()
        entry[1] += 1
    ranked = sorted(by_name.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
    result.update(
        kernels_per_step=len(kernels) / steps,
        gpu_busy_ms=busy_us / 1000 / steps,
        top_kernels=[
            [name, round(t / 1000 / steps, 2), round(100 * t / max(busy_us, 1), 1), int(n) // steps]
            for name, (t, n) in ranked
        ],
    )
    return result


def measure_step_time(
    config: Mapping[str, Any],
    batch_size: int,
    size: Size,
    device: torch.device,
    warmup: int = 3,
    iters: int = 10,
    profile_steps: int = 2,
) -> Dict[str, Any]:
    """``Trainer.step`` of ``config`` on device-resident synthetic batches of ``batch_size`` at ``size``."""
    started = time.perf_counter()
    trainer = _build(config, batch_size, size, device)
    batches = [device_batch(trainer, b) for b, _ in zip(trainer.train_loader, range(2))]
    record: Dict[str, Any] = {
        "batch_size": batch_size,
        "size": list(size),
        "device": str(device),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if device.type == "cuda" else None,
        "build_s": round(time.perf_counter() - started, 2),
    }
    tick = time.perf_counter()
    if trainer.step_graph is not None:  # its eager steps and the capture are warm-up too
        warmup = max(warmup, trainer.step_graph.eager_steps_left + 1)
        record["cuda_graph"] = True
    for i in range(warmup):  # the first step allocates and, with autotuning, searches
        trainer.step(batches[i % 2])
    _sync(device)
    record["warmup_s"] = round(time.perf_counter() - tick, 2)
    issue = []
    for i in range(min(3, iters)):  # host time to issue one step from an idle device
        _sync(device)
        tick = time.perf_counter()
        trainer.step(batches[i % 2])
        issue.append(time.perf_counter() - tick)
        _sync(device)
    clock = StepMarks(device)
    clock.mark()
    for i in range(iters):
        trainer.step(batches[i % 2])
        clock.mark()
    intervals = clock.intervals()
    median = statistics.median(intervals)
    record.update(
        steps=iters,
        ms_per_step=round(1000 * median, 2),
        mean_ms_per_step=round(1000 * sum(intervals) / len(intervals), 2),
        samples_per_s=round(batch_size / median, 2),
        issue_ms=round(1000 * min(issue), 2) if issue else None,
    )
    if profile_steps > 0:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for i in range(profile_steps):
                trainer.step(batches[i % 2])
            _sync(device)
        record.update(profile_summary(prof, profile_steps, device))
        if "gpu_busy_ms" in record:
            record["gpu_busy_pct"] = round(100 * record["gpu_busy_ms"] / (1000 * median), 1)
    if device.type == "cuda":
        record["max_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return record


def measure_size_costs(
    config: Mapping[str, Any],
    batch_size: int,
    sizes: Sequence[Size],
    device: torch.device,
    next_steps: int = 2,
) -> List[Dict[str, Any]]:
    """Per training size: the first step's time and the ``next_steps`` after it (ms), with cuDNN
    autotuning on for the sizes at even positions of ``sizes`` and off for those at odd ones
    (separate sizes: a shape tuned once stays tuned)."""
    trainer = _build(config, batch_size, tuple(sizes[0]), device)
    before = torch.backends.cudnn.benchmark
    try:
        records = _first_steps(trainer, config, batch_size, sizes, device, next_steps)
    finally:
        torch.backends.cudnn.benchmark = before
    return records


def _first_steps(
    trainer: Any,
    config: Mapping[str, Any],
    batch_size: int,
    sizes: Sequence[Size],
    device: torch.device,
    next_steps: int,
) -> List[Dict[str, Any]]:
    records = []
    for index, size in enumerate(sizes):
        autotune = index % 2 == 0
        torch.backends.cudnn.benchmark = autotune
        batch = device_batch(trainer, synthetic_batch(config, tuple(size), batch_size))
        times = []
        for _ in range(1 + next_steps):
            _sync(device)
            tick = time.perf_counter()
            trainer.step(batch)
            _sync(device)
            times.append(round(1000 * (time.perf_counter() - tick), 2))
        records.append(
            {"size": list(size), "cudnn_benchmark": autotune, "first_ms": times[0], "next_ms": times[1:]}
        )
    return records


def spread(sizes: Sequence[Size], count: int) -> List[Size]:
    """``count`` of ``sizes`` evenly spread over the list, first and last included (all of them
    when ``count`` is at least their number)."""
    if count >= len(sizes):
        return list(sizes)
    if count <= 1:
        return [sizes[0]]
    return [sizes[round(i * (len(sizes) - 1) / (count - 1))] for i in range(count)]


def size_cost_summary(records: Sequence[Mapping[str, Any]], sizes: int) -> Dict[str, Any]:
    """What the two choices cost. A size's first step costs ``first - min(next)`` more than a
    steady one: with autotuning the search plus per-shape start-up (allocator, cached anchors),
    with heuristics the start-up alone; their difference x ``sizes`` is the search of all sizes
    (the list's first size is left out: its first step is also the process's first). And the
    steady step per megapixel with heuristics against autotuned kernels."""

    def extra_ms(autotune: bool) -> float:
        chosen = [r for r in records[1:] if r["cudnn_benchmark"] is autotune]
        return statistics.mean(r["first_ms"] - min(r["next_ms"]) for r in chosen) if chosen else 0.0

    def per_megapixel(autotune: bool) -> float:
        chosen = [r for r in records if r["cudnn_benchmark"] is autotune]
        return statistics.mean(min(r["next_ms"]) / (r["size"][0] * r["size"][1] / 1e6) for r in chosen)

    on, off = extra_ms(True), extra_ms(False)
    summary: Dict[str, Any] = {
        "first_step_extra_ms_autotuned": round(on, 2),
        "first_step_extra_ms_heuristics": round(off, 2),
        "search_s_all_sizes": round(max(on - off, 0.0) * sizes / 1000, 2),
    }
    if {bool(r["cudnn_benchmark"]) for r in records} == {True, False}:
        tuned, heuristic = per_megapixel(True), per_megapixel(False)
        summary.update(
            ms_per_megapixel_autotuned=round(tuned, 2),
            ms_per_megapixel_heuristics=round(heuristic, 2),
            heuristics_over_autotuned=round(heuristic / tuned, 3),
        )
    return summary


def format_step_time(name: str, precision: str, record: Mapping[str, Any]) -> str:
    """One report line (and its top kernel or operator) of ``measure_step_time``."""
    ranked = record.get("top_kernels") or record.get("top_cpu_ops")
    top = f"; top: {ranked[0][0][:60]} ({ranked[0][1]} ms/step)" if ranked else ""
    busy = f", GPU busy {record['gpu_busy_pct']}%" if "gpu_busy_pct" in record else ""
    kernels = f", {record['kernels_per_step']:.0f} kernels/step" if "kernels_per_step" in record else ""
    return (
        f"step {name} {precision}: batch {record['batch_size']} at {record['size'][0]}x{record['size'][1]}: "
        f"{record['ms_per_step']} ms/step (median of {record['steps']}; mean {record['mean_ms_per_step']}), "
        f"{record['samples_per_s']} samples/s, issue {record['issue_ms']} ms{busy}{kernels}{top}"
    )
