"""Smoothed log values read tensors only when the medians are asked for."""

import torch

from ppdist.engine.logger import SmoothedValues, format_train_line


def test_smoothed_values_take_tensors_and_numbers():
    values = SmoothedValues(window=3)
    for loss in (5.0, 1.0, 2.0, 3.0):  # the window keeps the last 3
        values.update({"loss": torch.tensor(loss), "acc": loss / 10})
    assert values.medians() == {"loss": 2.0, "acc": 0.2}


def test_train_line_has_paddle_fields():
    line = format_train_line(1, 8, 20, 0.001, {"loss": 1.5}, 0.01, 0.1, 32, 125.0)
    for field in (
        "epoch: [1/8]",
        "global_step: 20",
        "lr: 0.001000",
        "loss: 1.500000",
        "avg_reader_cost: 0.01000 s",
        "avg_batch_cost: 0.10000 s",
        "ips: 320.00000 samples/s",
        "eta: 0:02:05",
    ):
        assert field in line
