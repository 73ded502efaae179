"""StepClock and window_summary: per-step times after the warm-up, their median without the steps
that follow an epoch end, and the window's mean beside it."""

import itertools

import pytest

from ppdist.benchmark import steady_state
from ppdist.benchmark.report import best_run
from ppdist.benchmark.steady_state import StepClock, window_summary


def step(n, samples=8, reader=0.01, batch=0.1):
    return {"global_step": n, "samples": samples, "reader_cost": reader, "batch_cost": batch}


@pytest.fixture
def fake_clock(monkeypatch):
    """perf_counter reads 0, 1, 2, 4, 14, 15, 16, ...: the 4th timed step took 10 s."""
    times = itertools.chain([0.0, 1.0, 2.0, 4.0, 14.0], itertools.count(15.0))
    monkeypatch.setattr(steady_state.time, "perf_counter", lambda: next(times))


def test_window_is_the_steps_after_warmup_and_epoch_ends_leave_the_median(fake_clock):
    clock = StepClock(warmup=2, iters=4)
    for n in range(1, 9):  # steps 7 and 8 come after the window and are ignored
        clock.record(step(n, samples=100 if n <= 2 else 8, reader=0.02 if n == 4 else 0.01))
        if n == 5:
            clock.after_epoch()  # its epoch end lands in step 6's interval
    assert [s["global_step"] for s in clock.steps] == [3, 4, 5, 6]
    assert [s["epoch_end"] for s in clock.steps] == [False, False, False, True]
    summary = clock.throughput()
    # marks at steps 2..6: 0, 1, 2, 4, 14 -> intervals 1, 1, 2, 10
    assert summary["steps"] == 4 and summary["samples"] == 32 and summary["epoch_ends"] == 1
    assert summary["seconds"] == 14.0 and summary["samples_per_s"] == pytest.approx(32 / 14)
    assert summary["median_step_s"] == 1.0 and summary["median_samples_per_s"] == 8.0
    assert summary["avg_reader_cost"] == pytest.approx(0.05 / 4)
    assert summary["reader_fraction"] == pytest.approx((0.05 / 4) / 0.1)


def test_a_run_shorter_than_the_window_is_an_error():
    clock = StepClock(warmup=2, iters=5)
    for n in range(1, 5):
        clock.record(step(n))
    with pytest.raises(RuntimeError, match="ended before step 7"):
        clock.throughput()


def test_window_summary_and_best_run():
    steps = [{"samples": 10}, {"samples": 10, "epoch_end": True}, {"samples": 10}, {"samples": 10}]
    summary = window_summary(steps, [0.5, 3.0, 0.25, 1.0])
    assert summary["samples_per_s"] == 40 / 4.75 and summary["median_step_s"] == 0.5
    assert summary["median_samples_per_s"] == 20.0 and summary["epoch_ends"] == 1
    assert "avg_batch_cost" not in summary  # a bare loop reports no reader/batch costs
    runs = [
        {"samples_per_s": 9.0, "median_samples_per_s": 3.0},
        {"samples_per_s": 4.0, "median_samples_per_s": 5.0},
    ]
    assert best_run(runs)["median_samples_per_s"] == 5.0
