"""TEDS equals ppstructure's (tests/fixtures/paddle_table/make_eval_fixture.py: a dozen hand-written
table pairs scored by ppstructure's TEDS with apted 1.0.3): full and structure-only."""

import json
import os

import pytest

from ppdist.metrics.teds import TEDS, structure_html

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle_table", "eval_fixture.json")


@pytest.fixture(scope="module")
def pairs():
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)["teds"]


@pytest.mark.parametrize("structure_only", [False, True])
def test_scores_equal_ppstructure(pairs, structure_only):
    teds = TEDS(structure_only=structure_only)
    key = "structure_only" if structure_only else "full"
    got = [teds.evaluate(p["pred"], p["true"]) for p in pairs]
    assert got == pytest.approx([p[key] for p in pairs], abs=1e-12)
    assert len(set(round(s, 6) for s in got)) >= 5  # the pairs span identical, empty and partial matches


def test_structure_html_and_ignored_nodes():
    html = structure_html(["<thead>", "<tr>", "<td></td>", "</tr>", "</thead>"])
    assert html == "<html><body><table><thead><tr><td></td></tr></thead></table></body></html>"
    flat = structure_html(["<tr>", "<td></td>", "</tr>"])
    assert TEDS(structure_only=True).evaluate(html, flat) == pytest.approx(1 - 1 / 3)
    assert TEDS(structure_only=True, ignore_nodes=["thead"]).evaluate(html, flat) == 1.0
    assert TEDS().evaluate("<p>no table</p>", flat) == 0.0
    assert TEDS().evaluate(structure_html([]), structure_html([])) == 1.0
    assert TEDS().evaluate(structure_html([]), flat) == 0.0
