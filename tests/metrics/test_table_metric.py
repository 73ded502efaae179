"""TableMetric equals PaddleOCR's (tests/fixtures/paddle_table/make_eval_fixture.py): structure
accuracy (also with del_thead_tbody) and the cell-box metric of xyxy / xywh / xyxyxyxy boxes with
Paddle's keys; the structure TEDS; states merged from any split equal the unsplit numbers."""

import json
import os
import pickle

import numpy as np
import pytest

from ppdist.components import build_metric
from ppdist.errors import ConfigError
from ppdist.losses import SLALoss
from ppdist.metrics import TableMetric
from ppdist.metrics.polygon_match import intersection_area, is_valid
from ppdist.metrics.teds import TEDS, structure_html
from ppdist.postprocess import TableLabelDecode

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle_table", "eval_fixture.json")


@pytest.fixture(scope="module")
def record():
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


def _results(case, labels, lo=0, hi=None):
    return {
        "structure_batch_list": case["pred_structures"][lo:hi],
        "bbox_batch_list": [np.array(b, np.float32) for b in case["pred_boxes"][lo:hi]],
        "labels": {
            "structure_batch_list": labels["structure_batch_list"][lo:hi],
            "bbox_batch_list": [
                [np.array(b, np.float32) for b in boxes] for boxes in case["gt_boxes"][lo:hi]
            ],
        },
    }


@pytest.mark.parametrize(
    "name", ["structure", "del_thead_tbody", "bbox_xyxy", "bbox_xyxy_hmean", "bbox_xywh", "bbox_xyxyxyxy"]
)
def test_values_equal_paddle(record, name):
    case = record["metric"][name]
    metric = build_metric({"Metric": dict(name="TableMetric", **case["kwargs"])})
    metric.update(_results(case, record["decode"]["labels"]), None)
    got = metric.compute()
    assert got.keys() == case["values"].keys()
    for key, value in case["values"].items():
        assert got[key] == pytest.approx(value, abs=1e-9), key
    assert metric.main_indicator in got


def test_merged_states_equal_one_process_with_teds(record):
    case = record["metric"]["bbox_xyxy"]
    labels = record["decode"]["labels"]
    whole = TableMetric(compute_bbox_metric=True, teds=True, main_indicator="teds")
    whole.update(_results(case, labels), None)
    parts = []
    for lo, hi in ((0, 1), (1, 3)):
        part = TableMetric(compute_bbox_metric=True, teds=True, main_indicator="teds")
        part.update(_results(case, labels, lo, hi), None)
        parts.append(pickle.loads(pickle.dumps(part.state())))
    merged = TableMetric(compute_bbox_metric=True, teds=True, main_indicator="teds")
    merged.load_states(parts)
    assert merged.compute() == whole.compute()
    teds = TEDS(structure_only=True)
    expected = [
        teds.evaluate(structure_html(p[0]), structure_html(t))
        for p, t in zip(case["pred_structures"], labels["structure_batch_list"])
    ]
    assert whole.compute()["teds"] == pytest.approx(sum(expected) / 3, abs=1e-12)
    assert expected[1] == 1.0 and expected[0] < 1.0


def test_nothing_evaluated_and_config_errors():
    metric = TableMetric()
    assert np.isnan(metric.compute()["acc"]) and metric.nothing_evaluated == "no table was evaluated"
    with pytest.raises(ConfigError, match=r"Metric.main_indicator: expected one of \('acc',\) .*got 'hmean'"):
        TableMetric(main_indicator="hmean")
    with pytest.raises(ConfigError, match=r"Metric.box_format: expected one of .*got 'xy'"):
        build_metric({"Metric": {"name": "TableMetric", "box_format": "xy"}})


def test_upstream_sections_build():
    """The Metric sections of PaddleOCR's SLANet.yml and SLANet_ch.yml (loc_reg_num included)."""
    en = build_metric(
        {
            "Metric": dict(
                name="TableMetric",
                main_indicator="acc",
                compute_bbox_metric=False,
                loc_reg_num=4,
                box_format="xyxy",
            )
        }
    )
    ch = build_metric(
        {
            "Metric": dict(
                name="TableMetric",
                main_indicator="acc",
                compute_bbox_metric=False,
                loc_reg_num=8,
                box_format="xyxyxyxy",
                del_thead_tbody=True,
            )
        }
    )
    assert (en.box_format, ch.del_thead_tbody, ch.teds) == ("xyxy", True, None)
    with pytest.raises(
        ConfigError, match="Metric.loc_reg_num: box_format xyxyxyxy has 8 coordinates, got loc_reg_num 4"
    ):
        TableMetric(compute_bbox_metric=True, box_format="xyxyxyxy", loc_reg_num=4)


def test_config_validation_names_the_key():
    """config/validate runs the value rules before anything is built (check_values)."""
    with pytest.raises(ConfigError, match=r"Metric.main_indicator: expected one of \('acc', 'teds'\)"):
        TableMetric.check_values({"teds": True, "main_indicator": "hmean"}, "Metric")
    with pytest.raises(ConfigError, match=r"Loss.loc_loss: expected one of"):
        SLALoss.check_values({"loc_loss": "l2"}, "Loss")


def test_polygon_geometry():
    square = [(0, 0), (2, 0), (2, 2), (0, 2)]
    concave = [(0, 0), (4, 0), (1, 1), (0, 4)]  # a dart: area 4
    assert intersection_area(square, [(1, 1), (3, 1), (3, 3), (1, 3)]) == pytest.approx(1.0)
    assert intersection_area(concave, [(0, 0), (4, 0), (4, 4), (0, 4)]) == pytest.approx(4.0)
    assert intersection_area(concave, square) == pytest.approx(
        8 / 3
    )  # (0,0) (2,0) (2,2/3) (1,1) (2/3,2) (0,2)
    assert not is_valid([(0, 0), (2, 2), (2, 0), (0, 2)])  # a bow tie
    assert not is_valid([(1, 1), (1, 1), (1, 3), (1, 3)]) and is_valid(list(reversed(square)))


def test_perfect_predictions_through_the_decode_score_one():
    """The eval chain of the contract: a head output equal to the labels (step t: token t + 1)
    decoded by TableLabelDecode scores acc, box hmean and TEDS 1."""
    here = os.path.dirname(FIXTURE)
    decoder = TableLabelDecode(os.path.join(here, "table_structure_dict.txt"), merge_no_span_structure=True)
    with np.load(os.path.join(here, "eval_fixture.npz")) as data:
        batch = {k: data[f"decode/{k}"] for k in ("structure", "bboxes", "shape")}
    probs = np.eye(len(decoder.character), dtype=np.float32)[batch["structure"][:, 1:]]
    preds = {"structure_probs": probs, "loc_preds": batch["bboxes"][:, 1:]}
    metric = TableMetric(compute_bbox_metric=True, teds=True)
    metric.update(decoder(preds, batch), batch)
    assert metric.compute() == {
        "acc": pytest.approx(1.0, abs=1e-5),
        "bbox_metric_precision": 1.0,
        "bbox_metric_recall": 1.0,
        "bbox_metric_hmean": 1.0,
        "teds": 1.0,
    }
    assert metric.box_counts.matched == 4
