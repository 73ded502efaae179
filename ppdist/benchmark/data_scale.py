"""Data at scale: dataset index build time and memory per process, and COCO evaluation time.

Each build is measured in a fresh process (``python -m ppdist.benchmark.data_scale measure ...``):
wall time of the dataset's construction, resident-memory growth after it, and peak growth, with
``cache: off`` (every process parses), a cold cache (the first rank of a node parses and writes)
and a warm cache (the other ranks, the next run, a restart: they map the file).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from ppdist.benchmark.scale_data import write_coco_json, write_label_file
from ppdist.data.det import COCODataSet
from ppdist.data.index_cache import BUILDS
from ppdist.data.rec import SimpleDataSet
from ppdist.metrics.coco import BACKENDS, COCOMetric
from ppdist.utils import strict_json


def _status_mib() -> Dict[str, float]:
    with open("/proc/self/status", encoding="ascii") as handle:
        fields = dict(line.split(":", 1) for line in handle)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}


def measure_build(kind: str, path: str, cache: str) -> Dict[str, Any]:
    """Build one dataset in this process: seconds, samples and memory growth (MiB)."""
    gc.collect()
    before, builds = _status_mib(), dict(BUILDS)
    start = time.perf_counter()
    if kind == "rec":
        dataset: Any = SimpleDataSet(os.path.dirname(path), [path], [], cache=cache)
    else:
        dataset = COCODataSet(os.path.dirname(path), "images", os.path.basename(path), [], cache=cache)
    seconds = time.perf_counter() - start
    gc.collect()
    after = _status_mib()
    return {
        "samples": len(dataset),
        "parsed": BUILDS["built"] > builds["built"],
        "build_s": round(seconds, 2),
        "rss_growth_mib": round(after["VmRSS"] - before["VmRSS"], 1),
        "peak_growth_mib": round(after["VmHWM"] - before["VmRSS"], 1),
    }


def measure_in_fresh_process(kind: str, path: str, cache: str) -> Dict[str, Any]:
    """``measure_build`` in a new Python process (nothing shared with this one)."""
    out = subprocess.run(
        [sys.executable, "-m", "ppdist.benchmark.data_scale", "measure", kind, path, cache],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_rows(kind: str, path: str, size_label: str, cache_dir: str) -> List[Dict[str, Any]]:
    """cache off, cold and warm measurements of one input file."""
    rows = []
    for setting, cache in (
        ("off", "off"),
        ("cold (first rank)", cache_dir),
        ("warm (other ranks, restarts)", cache_dir),
    ):
        row = measure_in_fresh_process(kind, path, cache)
        rows.append(
            {"set": size_label, "cache": setting, "file_mib": round(os.path.getsize(path) / 2**20, 1), **row}
        )
    return rows


def synthetic_results(dataset: COCODataSet, start: int, stop: int, per_image: int) -> List[Dict[str, Any]]:
    """PP-YOLOE-like results for images ``start .. stop - 1``: the ground truth jittered plus random
    boxes, ``per_image`` each (seeded by ``start``)."""
    rng = np.random.default_rng(start)
    classes = len(dataset.clsid2catid)
    index, results = dataset.index, []
    for i in range(start, stop):
        rows = slice(int(index["box_start"][i]), int(index["box_start"][i + 1]))
        gt = np.asarray(index["gt_bbox"][rows], dtype=np.float32)[:per_image]
        labels = np.asarray(index["gt_class"][rows], dtype=np.int64)[: len(gt)]
        extra = per_image - len(gt)
        size = np.array([index["width"][i], index["height"][i]])
        xy = rng.uniform(0, 0.7, size=(extra, 2)) * size
        wh = rng.uniform(0.05, 0.3, size=(extra, 2)) * size
        boxes = np.concatenate([gt + rng.normal(0, 2, size=gt.shape), np.concatenate([xy, xy + wh], 1)])
        results.append(
            {
                "im_id": torch.tensor(dataset.image_id(i)),
                "boxes": torch.from_numpy(boxes.astype(np.float32)),
                "scores": torch.from_numpy(rng.uniform(0.01, 1.0, size=per_image).astype(np.float32)),
                "labels": torch.from_numpy(np.concatenate([labels, rng.integers(0, classes, size=extra)])),
            }
        )
    return results


def measure_eval(path: str, per_image: int, backend: str) -> Dict[str, Any]:
    """The rank-0 work of a COCO evaluation: merge, ground truth read, COCOeval; time and memory."""
    dataset = COCODataSet(
        os.path.dirname(path), "images", os.path.basename(path), [], mode="eval", cache="off"
    )
    metric = COCOMetric(backend=backend)
    metric.bind_dataset(dataset)
    for start in range(0, len(dataset), 64):
        metric.update(synthetic_results(dataset, start, min(len(dataset), start + 64), per_image), {})
    state_bytes = int(metric.state()["detections"].nbytes)
    gc.collect()
    before = _status_mib()
    start = time.perf_counter()
    metrics = metric.compute()
    seconds = time.perf_counter() - start
    after = _status_mib()
    return {
        "backend": backend,
        "images": len(dataset),
        "classes": len(dataset.clsid2catid),
        "detections": int(len(metric.detections)),
        "state_bytes": state_bytes,
        "compute_s": round(seconds, 1),
        "peak_growth_mib": round(after["VmHWM"] - before["VmRSS"], 1),
        "ap": round(metrics["ap"], 4),
    }


def run(
    workdir: str,
    lines: Sequence[int],
    coco_sets: Sequence[Sequence[int]],
    eval_sets: Sequence[Sequence[int]],
    backends: Sequence[str] = BACKENDS,
) -> Dict[str, Any]:
    """Make the inputs under ``workdir`` (kept for reruns) and measure them."""
    os.makedirs(workdir, exist_ok=True)
    cache_dir = tempfile.mkdtemp(prefix="index_cache_", dir=workdir)
    report: Dict[str, Any] = {"build": [], "eval": []}
    for count in lines:
        path = os.path.join(workdir, f"rec_{count}.txt")
        if not os.path.exists(path):
            write_label_file(path, count)
        report["build"] += build_rows("rec", path, f"label file, {count:,} lines", cache_dir)
    for images, boxes, classes in coco_sets:
        path = os.path.join(workdir, f"coco_{images}_{boxes}_{classes}.json")
        if not os.path.exists(path):
            write_coco_json(path, images, boxes, classes)
        report["build"] += build_rows(
            "coco", path, f"COCO json, {images:,} images / {boxes:,} boxes", cache_dir
        )
    for images, boxes, classes, per_image in eval_sets:
        path = os.path.join(workdir, f"coco_{images}_{boxes}_{classes}.json")
        if not os.path.exists(path):
            write_coco_json(path, images, boxes, classes, seed=1)
        for backend in backends:
            out = subprocess.run(
                [sys.executable, "-m", "ppdist.benchmark.data_scale", "eval", path, str(per_image), backend],
                check=True,
                capture_output=True,
                text=True,
            )
            report["eval"].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return report


def format_tables(report: Dict[str, Any]) -> str:
    """Markdown tables of ``run``'s report."""
    lines = [
        "| set | cache | file MiB | samples | parsed here | build s | RSS growth MiB | peak growth MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["build"]:
        lines.append(
            f"| {r['set']} | {r['cache']} | {r['file_mib']} | {r['samples']:,} | {'yes' if r['parsed'] else 'no'} | "
            f"{r['build_s']} | "
            f"{r['rss_growth_mib']} | {r['peak_growth_mib']} |"
        )
    if report["eval"]:
        lines += [
            "",
            "| backend | images | classes | detections | state MiB | rank-0 compute s | peak growth MiB | AP |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in report["eval"]:
            lines.append(
                f"| {r['backend']} | {r['images']:,} | {r['classes']} | {r['detections']:,} | {r['state_bytes'] / 2**20:.1f} | "
                f"{r['compute_s']} | {r['peak_growth_mib']} | {r['ap']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "measure":
        print(strict_json.dumps(measure_build(sys.argv[2], sys.argv[3], sys.argv[4])))
    elif sys.argv[1] == "eval":
        print(strict_json.dumps(measure_eval(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
