"""Multi-process throughput: the trainer measurement under torchrun with 1 and K processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Sequence

from ppdist.errors import PPDistError

BENCHMARK_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools", "benchmark.py"
)


def trainer_command(
    nproc: int,
    config_path: str,
    overrides: Sequence[str],
    warmup: int,
    iters: int,
    threads: int,
    json_path: str,
    output_dir: str,
    workers: str = "auto",
) -> List[str]:
    """``torchrun --standalone --nproc_per_node K tools/benchmark.py ... --part trainer``."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        BENCHMARK_SCRIPT,
        "-c",
        config_path,
    ]
    if overrides:
        command += ["-o", *overrides]
    return command + [
        "--part",
        "trainer",
        "--warmup",
        str(warmup),
        "--iters",
        str(iters),
        "--threads",
        str(threads),
        "--json",
        json_path,
        "--output_dir",
        output_dir,
        "--workers",
        workers,
    ]


def run_trainer_processes(
    nproc: int,
    config_path: str,
    overrides: Sequence[str],
    warmup: int,
    iters: int,
    threads: int,
    work_dir: str,
    workers: str = "auto",
) -> Dict[str, Any]:
    """The trainer measurement with ``nproc`` processes of ``threads`` threads each."""
    os.makedirs(work_dir, exist_ok=True)
    json_path = os.path.join(work_dir, f"trainer_{nproc}proc.json")
    log_path = os.path.join(work_dir, f"trainer_{nproc}proc.log")
    command = trainer_command(
        nproc,
        config_path,
        overrides,
        warmup,
        iters,
        threads,
        json_path,
        os.path.join(work_dir, f"run_{nproc}proc"),
        workers,
    )
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0 or not os.path.isfile(json_path):
        raise PPDistError(
            f"the {nproc}-process trainer run failed (exit code {done.returncode}); see {log_path}"
        )
    with open(json_path, "r", encoding="utf-8") as handle:
        result = json.load(handle)["trainer"]
    result["threads_per_process"] = threads
    return result


def scaling_summary(single: Dict[str, Any], multi: Dict[str, Any], nproc: int) -> Dict[str, Any]:
    rate = "median_samples_per_s"  # per step, epoch ends left out (steady_state)
    speedup = multi[rate] / single[rate] if single[rate] > 0 else 0.0
    return {
        "processes": nproc,
        "threads_per_process": multi["threads_per_process"],
        "single": single,
        "multi": multi,
        "speedup": speedup,
        "efficiency": speedup / nproc,
    }
