"""PaddleOCR's learning-rate schedules, step by step: ppdist's Piecewise and Cosine with a warm-up
give the LR PaddleOCR 2.7's own schedulers give at every iteration (fixture made by
tests/fixtures/paddle_lr/make_ppocr_lr.py with paddlepaddle 2.6.2)."""

import json
import os

import pytest

from ppdist.optim import CosineLR, PiecewiseLR

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "paddle_lr", "ppocr_lr.json")
with open(FIXTURE) as handle:
    CASES = json.load(handle)
SCHEDULES = {"Piecewise": PiecewiseLR, "Cosine": CosineLR}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_step_equals_paddleocr(case):
    spec = CASES[case]
    schedule = SCHEDULES[spec["name"]](
        epochs=spec["epochs"], step_each_epoch=spec["step_each_epoch"], **spec["kwargs"]
    )
    ours = [schedule.lr_at(step) for step in range(len(spec["lrs"]))]
    assert ours == pytest.approx(spec["lrs"], rel=1e-9, abs=1e-12)


def test_piecewise_boundaries_count_after_the_warmup_as_paddleocr_and_from_zero_as_paddledetection():
    ocr = PiecewiseLR(step_each_epoch=4, decay_epochs=[8], values=[0.5, 0.05], warmup_epoch=5)
    assert [ocr.lr_at(s) for s in (19, 20, 51, 52)] == [pytest.approx(0.475), 0.5, 0.5, 0.05]
    det = PiecewiseLR(
        step_each_epoch=4, decay_epochs=[8], values=[0.5, 0.05], warmup_epoch=5, boundaries_after_warmup=False
    )
    assert [det.lr_at(s) for s in (20, 31, 32)] == [0.5, 0.5, 0.05]
