"""tools/benchmark_data.py at toy sizes: every build measured in a fresh process, the warm cache
parses nothing, and the evaluation numbers come from real detections."""

import json
import subprocess
import sys

import pytest

from ppdist.benchmark.data_scale import format_tables, measure_eval
from ppdist.benchmark.scale_data import write_coco_json

TOOL = "tools/benchmark_data.py"


@pytest.mark.slow
def test_scale_benchmark_reports_builds_off_cold_and_warm(tmp_path, repo_root):
    out = tmp_path / "report.json"
    subprocess.run(
        [
            sys.executable,
            TOOL,
            "--lines",
            "3000",
            "--coco",
            "--eval",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ],
        check=True,
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    report = json.loads(out.read_text())
    rows = report["build"]
    assert [r["cache"].split()[0] for r in rows] == ["off", "cold", "warm"]
    assert [r["parsed"] for r in rows] == [True, True, False]  # warm: mapped, not parsed
    assert [r["samples"] for r in rows] == [3000] * 3
    assert "| warm (other ranks, restarts) |" in format_tables(report)


def test_eval_measurement_scores_synthetic_detections(tmp_path):
    path = tmp_path / "val.json"
    write_coco_json(str(path), images=40, boxes=300, classes=5, seed=1)
    result = measure_eval(str(path), per_image=10, backend="faster_coco_eval")
    assert result["images"] == 40 and result["detections"] == 400 and 0 < result["ap"] <= 1
    assert result["state_bytes"] == 400 * 7 * 8  # 7 float64 per detection, nothing per-detection in Python
