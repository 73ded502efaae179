"""RecMetric: accuracy / normalised edit distance, text normalisation and exact merging."""

import pickle
import random

import pytest

from ppdist.metrics import Metric, RecMetric
from ppdist.registry import METRICS

EPS = 1e-5


def results(pairs):
    return {"preds": [(p, 0.5) for p, _ in pairs], "labels": [label for _, label in pairs]}


def test_known_values():
    metric = METRICS.build({"name": "RecMetric", "main_indicator": "acc"})
    assert isinstance(metric, Metric) and metric.main_indicator == "acc"
    metric.update(results([("hello", "hello"), ("abc", "abd"), ("", "xy")]), {})
    out = metric.compute()
    assert out["acc"] == pytest.approx(1 / (3 + EPS))
    # distances: 0, 1/3, 1
    assert out["norm_edit_dis"] == pytest.approx(1 - (1 / 3 + 1) / (3 + EPS))


def test_ignore_space():
    pairs = [("wor ld", "world"), ("a b", "ab ")]
    assert RecMetric().compute() == {"acc": 0.0, "norm_edit_dis": 1.0}
    spaced = RecMetric()
    spaced.update(results(pairs), {})
    assert spaced.compute()["acc"] == pytest.approx(2 / (2 + EPS))
    strict = RecMetric(ignore_space=False)
    strict.update(results(pairs), {})
    assert strict.compute()["acc"] == 0.0
    assert strict.compute()["norm_edit_dis"] == pytest.approx(1 - (1 / 6 + 2 / 3) / (2 + EPS))


def test_is_filter_keeps_alnum_lowercased():
    pairs = [("Hello!", "hello"), ("A-1", "a1"), ("ab", "AB")]
    plain = RecMetric()
    plain.update(results(pairs), {})
    assert plain.compute()["acc"] == 0.0
    filtered = RecMetric(is_filter=True)
    filtered.update(results(pairs), {})
    assert filtered.compute()["acc"] == pytest.approx(3 / (3 + EPS))


def test_compute_does_not_reset_and_reset_does():
    metric = RecMetric()
    metric.update(results([("a", "a"), ("b", "c")]), {})
    first = metric.compute()
    assert metric.compute() == first
    metric.reset()
    assert metric.state() == {
        "correct_num": 0,
        "all_num": 0,
        "edit_distances": [],
        "mistakes": [],
    }


def random_text(rng):
    return "".join(rng.choice("abcde ") for _ in range(rng.randint(0, 9)))


def test_merge_of_random_split_equals_single_run_exactly():
    rng = random.Random(0)
    pairs = [(random_text(rng), random_text(rng)) for _ in range(1000)]
    for _, label in pairs[:100]:
        pairs.append((label, label))
    rng.shuffle(pairs)

    single = RecMetric()
    for start in range(0, len(pairs), 64):
        single.update(results(pairs[start : start + 64]), {})

    cut1, cut2 = sorted(rng.sample(range(1, len(pairs)), 2))
    states = []
    for part in (pairs[:cut1], pairs[cut1:cut2], pairs[cut2:]):
        rank = RecMetric()
        for start in range(0, len(part), 37):
            rank.update(results(part[start : start + 37]), {})
        states.append(pickle.loads(pickle.dumps(rank.state())))

    merged = RecMetric()
    merged.update(results([("stale", "state")]), {})  # load_states replaces, not adds
    merged.load_states(states)
    assert merged.compute() == single.compute()
    assert merged.state()["all_num"] == len(pairs)
    # and in any rank order
    reordered = RecMetric()
    reordered.load_states(states[::-1])
    assert reordered.compute() == single.compute()


def test_state_is_plain_python():
    metric = RecMetric()
    metric.update(results([("ab", "abc")]), {})
    state = metric.state()
    assert type(state["correct_num"]) is int and type(state["all_num"]) is int
    assert all(type(d) is float for d in state["edit_distances"])


def test_invalid_main_indicator():
    with pytest.raises(ValueError, match="main_indicator"):
        RecMetric(main_indicator="accuracy")
