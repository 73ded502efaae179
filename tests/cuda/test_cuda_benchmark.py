"""tools/benchmark.py on one GPU: the trainer and the bare loop run on CUDA."""

import json
import os

from ppdist_testing import check_ok, run_tool


def test_benchmark_tool_on_cuda(tmp_path):
    out = str(tmp_path / "bench.json")
    check_ok(
        run_tool(
            [
                "benchmark.py",
                "-c",
                os.path.join("configs", "det", "quickstart_synth.yml"),
                "--iters",
                "20",
                "--warmup",
                "5",
                "--skip",
                "scaling",
                "infer",
                "--json",
                out,
                "--output_dir",
                str(tmp_path / "bench"),
            ]
        )
    )
    with open(out, encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["environment"]["cuda"] is not None, report["environment"]
    assert report["trainer"]["samples_per_s"] > 0 and report["bare_loop"]["samples_per_s"] > 0
    # per-step times from CUDA events: the median step and the window, every size warmed first
    for run in (report["trainer"], report["bare_loop"]):
        assert run["median_samples_per_s"] > 0 and run["steps"] == 20
        assert run["warmed_sizes"] == [[128, 128], [160, 160], [192, 192]]
