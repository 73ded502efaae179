"""PaddleOCR's and PaddleDetection's learning-rate schedules, step by step: ppdist's Piecewise and
Cosine with a warm-up give the LR PaddleOCR 2.7's and PaddleDetection 2.7.1's own schedulers give at
every iteration (fixtures made by tests/fixtures/paddle_lr/make_ppocr_lr.py and make_ppdet_lr.py
with paddlepaddle 2.6.2)."""

import json
import os

import pytest

from ppdist.convert.configs.common import Keys, Report
from ppdist.convert.configs.det_schedule import convert_det_optimizer
from ppdist.errors import ConfigError
from ppdist.optim import CosineLR, PiecewiseLR, build_lr_schedule

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


with open(os.path.join(os.path.dirname(FIXTURE), "ppdet_lr.json")) as handle:
    DET_CASES = json.load(handle)


@pytest.mark.parametrize("case", sorted(DET_CASES))
def test_paddledetection_piecewise_with_a_step_warmup_equals_it_at_every_step(case):
    """PaddleDetection's PiecewiseDecay + LinearWarmup (steps, start_factor) through ppdist's config
    converter: the LR of every step equals ppdet's (fixture: make_ppdet_lr.py), also when the
    warm-up outlasts the first milestone (the warm-up wins until it ends, as in PaddleDetection)."""
    spec = DET_CASES[case]
    report = Report()
    section = {
        "LearningRate": {
            "base_lr": spec["base_lr"],
            "schedulers": [
                {"name": "PiecewiseDecay", **spec["PiecewiseDecay"]},
                {"name": "LinearWarmup", **spec["LinearWarmup"]},
            ],
        }
    }
    lr_cfg = convert_det_optimizer(Keys(section, "", report), report, "x.yml")["lr"]
    assert not report.unmapped, report.unmapped
    schedule = build_lr_schedule(lr_cfg, spec["epochs"], spec["step_each_epoch"])
    ours = [schedule.lr_at(step) for step in range(len(spec["lrs"]))]
    assert ours == pytest.approx(spec["lrs"], rel=1e-12, abs=0)


def test_piecewise_boundaries_in_iterations():
    schedule = PiecewiseLR(step_each_epoch=7, decay_iters=[60, 80], values=[0.02, 0.002, 0.0002])
    assert [schedule.lr_at(s) for s in (59, 60, 79, 80)] == [0.02, 0.002, 0.002, 0.0002]
    with pytest.raises(ConfigError, match="decay_epochs or decay_iters"):
        PiecewiseLR(step_each_epoch=7, decay_iters=[60], decay_epochs=[2], values=[0.1, 0.01])
