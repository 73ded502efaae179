"""tools/benchmark.py --step_time's measurements on CPU: the bare step's per-step times and profile,
and a multi-scale recipe's first step per size with cuDNN autotuning on and off."""

import pytest
from ppdist_testing import tiny_det_config

from ppdist.benchmark.step_time import measure_size_costs, measure_step_time, size_cost_summary, spread
from ppdist.config import load_config

CPU = __import__("torch").device("cpu")


def test_the_size_cost_summary_separates_the_search_from_the_start_up():
    records = [
        {"size": [100, 100], "cudnn_benchmark": True, "first_ms": 900.0, "next_ms": [10.0, 12.0]},
        {"size": [200, 100], "cudnn_benchmark": False, "first_ms": 30.0, "next_ms": [22.0, 20.0]},
        {"size": [200, 200], "cudnn_benchmark": True, "first_ms": 140.0, "next_ms": [40.0, 40.0]},
        {"size": [300, 200], "cudnn_benchmark": False, "first_ms": 80.0, "next_ms": [70.0, 90.0]},
    ]
    summary = size_cost_summary(records, 15)
    # tuned sizes but the first: 140 - 40 = 100 ms; heuristics: (10 + 10) / 2 = 10 ms
    assert summary["first_step_extra_ms_autotuned"] == 100.0
    assert summary["first_step_extra_ms_heuristics"] == 10.0
    assert summary["search_s_all_sizes"] == 1.35  # (100 - 10) ms x 15 sizes
    # per megapixel: tuned (10/0.01 + 40/0.04)/2 = 1000, heuristics (20/0.02 + 70/0.06)/2 = 1083.33
    assert summary["ms_per_megapixel_autotuned"] == 1000.0
    assert summary["ms_per_megapixel_heuristics"] == 1083.33
    assert summary["heuristics_over_autotuned"] == 1.083


def test_spread_picks_sizes_over_the_whole_list():
    sizes = [(s, s) for s in range(320, 769, 32)]  # PP-YOLOE's 15
    assert spread(sizes, 6) == [(s, s) for s in (320, 416, 512, 576, 672, 768)]
    assert spread(sizes, 20) == sizes and spread(sizes, 1) == [(320, 320)]


@pytest.mark.slow
def test_step_time_and_size_costs_on_a_tiny_detector(tmp_path):
    path = tiny_det_config(str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "o"))
    config = load_config(
        path, ["Train.dataset.batch_transforms.0.BatchRandomResize.target_size=[64, 96, 80]"]
    )
    record = measure_step_time(config, 2, (64, 64), CPU, warmup=1, iters=3, profile_steps=1)
    assert (record["batch_size"], record["size"], record["steps"]) == (2, [64, 64], 3)
    # both rounded to 2 decimals: the rate itself by up to 0.005, and the rate from the rounded
    # milliseconds by up to rate * 0.005 / ms (a 49.21 ms step: 0.004)
    rate = 2 / (record["ms_per_step"] / 1000)
    assert record["samples_per_s"] == pytest.approx(
        rate, abs=0.005 + rate * 0.005 / record["ms_per_step"] + 1e-9
    )
    assert record["issue_ms"] > 0 and record["top_cpu_ops"][0][0].startswith("aten::")
    costs = measure_size_costs(config, 2, [(64, 64), (96, 96), (80, 80)], CPU, next_steps=1)
    assert [(r["size"], r["cudnn_benchmark"], len(r["next_ms"])) for r in costs] == [
        ([64, 64], True, 1),
        ([96, 96], False, 1),
        ([80, 80], True, 1),
    ]
    assert not __import__("torch").backends.cudnn.benchmark  # restored (off on a CPU-only process)
