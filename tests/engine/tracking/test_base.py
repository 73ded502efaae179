"""trainer.writer fans every scalar and checkpoint out to its sinks, the same numbers to each,
and a failing sink is warned about once per outage, left alone for a while and tried again."""

from __future__ import annotations

import logging

from ppdist.engine.logger import ScalarWriter
from ppdist.engine.tracking import GuardedSink, Sink


class Recording(Sink):
    label = "recording"

    def __init__(self) -> None:
        self.calls = []

    def log_scalars(self, prefix, values, step):
        self.calls.append(("scalars", prefix, dict(values), step))

    def log_checkpoint(self, name, path, step):
        self.calls.append(("checkpoint", name, path, step))

    def close(self):
        self.calls.append(("close",))


class Flaky(Recording):
    label = "flaky"

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    def log_scalars(self, prefix, values, step):
        if self.down:
            raise ConnectionError("server unreachable")
        super().log_scalars(prefix, values, step)


def test_every_sink_gets_the_same_numbers_and_checkpoints():
    first, second = Recording(), Recording()
    writer = ScalarWriter(None, [first])
    writer.add_sink(second)
    writer.add_scalars("eval", {"acc": 0.5, "best_step": 12, "per_class": [0.1, 0.9], "flag": True}, 12)
    writer.log_checkpoint("best_accuracy", "/runs/a/best_accuracy.pt", 12)
    writer.close()
    expected = [
        ("scalars", "eval", {"acc": 0.5, "best_step": 12.0}, 12),
        ("checkpoint", "best_accuracy", "/runs/a/best_accuracy.pt", 12),
        ("close",),
    ]
    assert first.calls == second.calls == expected
    assert writer.sinks == []


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_failing_sink_warns_once_drops_while_waiting_then_recovers():
    now = [0.0]
    sink = Flaky()
    guarded = GuardedSink(sink, retry_after_s=60.0, clock=lambda: now[0])
    ppdist_logger, collect = logging.getLogger("ppdist"), Collect()
    level = ppdist_logger.level
    ppdist_logger.addHandler(collect)
    ppdist_logger.setLevel(logging.INFO)
    try:
        guarded.log_scalars("train", {"loss": 1.0}, 1)  # fails: warned
        now[0] = 30.0
        guarded.log_scalars("train", {"loss": 0.9}, 2)  # inside the pause: dropped, not tried
        now[0] = 61.0
        guarded.log_scalars("train", {"loss": 0.8}, 3)  # tried again, fails: no second warning
        sink.down = False
        now[0] = 122.0
        guarded.log_scalars("train", {"loss": 0.7}, 4)  # works again
        guarded.close()
    finally:
        ppdist_logger.removeHandler(collect)
        ppdist_logger.setLevel(level)
    messages = [(r.levelno, r.getMessage()) for r in collect.records]
    assert [level for level, _ in messages] == [logging.WARNING, logging.INFO, logging.WARNING]
    assert (
        "flaky: log_scalars failed (ConnectionError: server unreachable); training goes on" in messages[0][1]
    )
    assert messages[1][1] == "flaky: logging works again (3 call(s) dropped so far)"
    assert messages[2][1] == "flaky: 3 logging call(s) failed or were dropped in this run"
    assert sink.calls == [("scalars", "train", {"loss": 0.7}, 4), ("close",)]
