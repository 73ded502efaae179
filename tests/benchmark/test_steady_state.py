"""StepClock: only the steps after the warm-up are timed and counted."""

import pytest

from ppdist.benchmark.report import best_run
from ppdist.benchmark.steady_state import StepClock, window_summary


def step(n, samples=8, reader=0.01, batch=0.1):
    return {"global_step": n, "samples": samples, "reader_cost": reader, "batch_cost": batch}


def test_window_is_the_steps_after_warmup():
    clock = StepClock(warmup=2, iters=3)
    for n in range(1, 8):  # steps 6 and 7 come after the window and are ignored
        clock.record(step(n, samples=100 if n <= 2 else 8, reader=0.02 if n == 4 else 0.01))
    assert [s["global_step"] for s in clock.steps] == [3, 4, 5]
    summary = clock.throughput()
    assert summary["steps"] == 3 and summary["samples"] == 24
    assert summary["seconds"] > 0
    assert summary["samples_per_s"] == pytest.approx(24 / summary["seconds"])
    assert summary["avg_reader_cost"] == pytest.approx(0.04 / 3)
    assert summary["reader_fraction"] == pytest.approx((0.04 / 3) / 0.1)


def test_a_run_shorter_than_the_window_is_an_error():
    clock = StepClock(warmup=2, iters=5)
    for n in range(1, 5):
        clock.record(step(n))
    with pytest.raises(RuntimeError, match="ended before step 7"):
        clock.throughput()


def test_window_summary_and_best_run():
    summary = window_summary([step(1, 10, 0.0, 0.5), step(2, 30, 0.1, 0.5)], seconds=2.0)
    assert summary["samples_per_s"] == 20.0 and summary["reader_fraction"] == pytest.approx(0.1)
    assert (
        best_run([{"samples_per_s": 3.0}, {"samples_per_s": 5.0}, {"samples_per_s": 4.0}])["samples_per_s"]
        == 5.0
    )
