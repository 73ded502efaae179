"""Every JSON file ppdist writes is strict JSON: non-finite floats are written as null, and no
module writes JSON past the one helper."""

import json
import math
import os
import re

import numpy as np
import pytest

from ppdist.utils import strict_json

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def strict_loads(text):
    """``json.loads`` that refuses NaN / Infinity, as strict JSON readers do."""

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_are_written_as_null_at_any_depth():
    value = {
        "score": float("nan"),
        "boxes": [[1.0, float("inf")], (np.float32("nan"), np.float64(2.5))],
        "ok": 0.5,
        "n": 3,
    }
    text = strict_json.dumps(value)
    assert strict_loads(text) == {"score": None, "boxes": [[1.0, None], [None, 2.5]], "ok": 0.5, "n": 3}


def test_what_the_default_function_gives_is_made_finite_too():
    class Odd:
        pass

    assert strict_loads(strict_json.dumps({"a": Odd()}, default=lambda _: float("-inf"))) == {"a": None}
    with pytest.raises(TypeError):
        strict_json.dumps({"a": Odd()})  # no default: json's own error


def test_dump_writes_the_same_as_dumps(tmp_path):
    path = tmp_path / "x.json"
    with open(path, "w") as handle:
        strict_json.dump([math.nan, 1], handle, indent=1)
    assert path.read_text() == strict_json.dumps([math.nan, 1], indent=1)
    assert strict_loads(path.read_text()) == [None, 1]


def test_no_module_writes_json_past_the_helper():
    calls = re.compile(r"(?<![\w.])json\.dumps?\(")
    found = []
    for top in ("ppdist", "tools"):
        for folder, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                path = os.path.join(folder, name)
                if name.endswith(".py") and not path.endswith(os.path.join("utils", "strict_json.py")):
                    with open(path, encoding="utf-8") as handle:
                        found += [f"{os.path.relpath(path, REPO)}" for line in handle if calls.search(line)]
    assert found == []
