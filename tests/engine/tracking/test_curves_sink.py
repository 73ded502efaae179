"""CurvesSink: the writer's values kept in memory, curves.png drawn after each evaluation and at
the end, a failed drawing a warning that keeps the values, and the values as a checkpoint holds them."""

import logging
import os

from picture_testing import assert_picture
from ppdist_testing import ppdist_log_records

from ppdist.engine.logger import ScalarWriter
from ppdist.engine.tracking.curves import CurvesSink, series_from_state, series_state


def test_the_sink_draws_after_evaluations_and_at_the_end(tmp_path):
    sink = CurvesSink(str(tmp_path), history={"train/loss": {2: 5.0}})
    writer = ScalarWriter(sinks=[sink])
    path = tmp_path / "curves.png"
    writer.add_scalars("train", {"loss": 4.0, "lr": 0.1, "ips": 99.0}, 4)
    assert not path.exists()  # training values alone: no drawing
    writer.add_scalars("eval", {"acc": 0.5, "images": 51, "fps": 3.0}, 4)
    assert_picture(str(path), (1500, 320))  # loss, lr, acc
    assert sink.series == {"train/loss": {2: 5.0, 4: 4.0}, "train/lr": {4: 0.1}, "eval/acc": {4: 0.5}}
    os.remove(path)
    writer.close()  # nothing new since the evaluation
    assert not path.exists()
    sink = CurvesSink(str(tmp_path))
    writer = ScalarWriter(sinks=[sink])
    writer.add_scalars("train", {"loss": 4.0, "lr": 0.1}, 4)
    writer.close()  # a run without evaluation: drawn once at the end
    assert_picture(str(path), (1000, 320))


def test_a_failed_drawing_keeps_the_values(tmp_path):
    os.makedirs(tmp_path / "curves.png")  # cannot be replaced by a file
    sink = CurvesSink(str(tmp_path))
    writer = ScalarWriter(sinks=[sink])
    with ppdist_log_records(logging.WARNING) as records:
        writer.add_scalars("eval", {"acc": 0.5}, 4)
        writer.add_scalars("train", {"loss": 1.0}, 6)
        writer.add_scalars("eval", {"acc": 0.7}, 8)
    assert sink.series == {"eval/acc": {4: 0.5, 8: 0.7}, "train/loss": {6: 1.0}}
    assert sum("curves.png not drawn" in r.getMessage() for r in records) == 2


def test_the_values_round_trip_through_a_checkpoint_state():
    series = {"train/loss": {2: 1.5, 4: 1.25}, "eval/acc": {4: 0.5}}
    state = series_state(series)
    assert state == {"train/loss": [[2, 4], [1.5, 1.25]], "eval/acc": [[4], [0.5]]}
    assert series_from_state(state) == series
