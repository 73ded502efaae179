"""DistillationMetric equals PaddleOCR's on DistillationCTCLabelDecode results (the fixture of
tests/fixtures/paddle_ppocrv3/make_loss_fixture.py) and merges per-rank states exactly."""

import os
import pickle

import numpy as np
import pytest
import torch
import yaml

from ppdist.config import load_config
from ppdist.errors import ConfigError
from ppdist.metrics import DistillationMetric, RecMetric
from ppdist.postprocess import DistillationCTCLabelDecode
from ppdist.registry import METRICS
from ppdist.visualize.eval_pictures import write_report

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle_ppocrv3")
DICT = os.path.join(FIXTURES, "loss_dict.txt")
MODELS = ("Student", "Teacher")
CONFIG = {"name": "DistillationMetric", "base_metric_name": "RecMetric", "main_indicator": "acc", "key": "Student",
          "ignore_space": False}  # fmt: skip


@pytest.fixture(scope="module")
def batches():
    with np.load(os.path.join(FIXTURES, "loss_fixture.npz")) as data:
        fixture = dict(data)
    decode = DistillationCTCLabelDecode(DICT, True, model_name=list(MODELS), key="head_out", multi_head=True)
    out = []
    for b in (0, 1):
        batch = {"label_ctc": torch.from_numpy(fixture[f"eval_label_ctc_{b}"])}
        preds = {m: {"head_out": torch.from_numpy(fixture[f"eval/{m}_{b}"])} for m in MODELS}
        out.append((decode(preds, batch), batch))
    expected = {k[len("metric/") :]: float(v) for k, v in fixture.items() if k.startswith("metric/")}
    return out, expected


def test_equals_paddle(batches):
    pairs, expected = batches
    metric = METRICS.build(CONFIG)
    assert metric.main_indicator == "acc"
    for results, batch in pairs:
        metric.update(results, batch)
    got = metric.compute()
    assert sorted(got) == sorted(expected) == ["Teacher_acc", "Teacher_norm_edit_dis", "acc", "norm_edit_dis"]
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name
    assert 0 < got["acc"] < 1 and got["norm_edit_dis"] != got["Teacher_norm_edit_dis"]


def test_two_way_state_merge_equals_unsplit(batches):
    pairs, _ = batches
    whole, ranks = METRICS.build(CONFIG), [METRICS.build(CONFIG), METRICS.build(CONFIG)]
    for i, (results, batch) in enumerate(pairs):
        whole.update(results, batch)
        ranks[i].update(results, batch)
    merged = METRICS.build(CONFIG)
    merged.load_states([pickle.loads(pickle.dumps(r.state())) for r in ranks])
    assert merged.compute() == whole.compute()
    empty_rank = METRICS.build(CONFIG)  # a rank without a batch holds no model yet
    merged.load_states([ranks[0].state(), empty_rank.state(), ranks[1].state()])
    assert merged.compute() == whole.compute()


def test_delegates_to_the_key_model(batches, tmp_path):
    pairs, _ = batches
    metric = DistillationMetric(key="Teacher", ignore_space=False)
    metric.bind_dataset("the dataset")
    assert metric.compute() == RecMetric().compute()  # nothing seen: the base metric's empty numbers
    for results, batch in pairs:
        metric.update(results, batch)
    assert all(m.dataset == "the dataset" for m in metric.metrics.values())
    assert set(metric.compute()) == {"acc", "norm_edit_dis", "Student_acc", "Student_norm_edit_dis"}
    written = write_report(metric.report(), str(tmp_path))
    teacher = metric.metrics["Teacher"]
    assert [os.path.basename(p) for p in written] == [
        os.path.basename(p) for p in write_report(teacher.report(), str(tmp_path / "t"))
    ]
    metric.reset()
    assert metric.compute()["acc"] == 0.0


def test_config_mistakes():
    with pytest.raises(ConfigError, match=r"unknown key Metric\.ignore_spaces for metric 'RecMetric'"):
        METRICS.build(dict(CONFIG, ignore_spaces=True))
    with pytest.raises(
        ConfigError, match=r"missing required key\(s\) for metric 'DistillationMetric' at Metric: key"
    ):
        METRICS.build({"name": "DistillationMetric"}, where="Metric")
    metric = METRICS.build(CONFIG)
    with pytest.raises(
        ValueError, match=r"key 'Student' is not a model of the post-process's results \(\['Teacher'\]\)"
    ):
        metric.update({"Teacher": {"preds": [], "labels": []}}, {})


def test_base_metric_keys_are_checked_by_config_validation(tmp_path, repo_root):
    with open(os.path.join(repo_root, "configs", "rec", "rec_mv3_none_bilstm_ctc.yml")) as handle:
        config = yaml.safe_load(handle)
    config["Metric"] = dict(CONFIG, ignore_spaces=False)
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(
        ConfigError, match=r"unknown key Metric\.ignore_spaces for metric 'RecMetric'.*'ignore_space'"
    ):
        load_config(str(path))
    config["Metric"] = dict(CONFIG, base_metric_name="RecMetrc")
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"unknown metric name 'RecMetrc'.*'RecMetric'"):
        load_config(str(path))
