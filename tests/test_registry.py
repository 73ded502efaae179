"""Registry: name lookup, signature-checked build, clear errors."""

from typing import List, Optional

import pytest

from ppdist.errors import ConfigError
from ppdist.registry import Registry


def make_registry() -> Registry:
    reg = Registry("widget")

    @reg.register
    class Knob:
        def __init__(self, size: int, label: str = "x", ratio: float = 1.0, tags: Optional[List[str]] = None):
            self.size, self.label, self.ratio, self.tags = size, label, ratio, tags

    @reg.register(name="Dial")
    class _Dial:
        def __init__(self, size: int, steps: int = 3):
            self.size, self.steps = size, steps

    return reg


def test_build_passes_kwargs_and_extra():
    reg = make_registry()
    knob = reg.build({"name": "Knob", "label": "y", "ratio": 2}, size=3)
    assert (knob.size, knob.label, knob.ratio) == (3, "y", 2)
    assert reg.names() == ["Dial", "Knob"]


def test_unknown_name_suggests_closest():
    with pytest.raises(ConfigError, match=r"unknown widget name 'Knb' at Sec.name.*Did you mean: 'Knob'"):
        make_registry().get("Knb", "Sec.name")


def test_unknown_key_suggests_and_names_owner():
    with pytest.raises(ConfigError) as err:
        make_registry().build({"name": "Knob", "size": 1, "steps": 2}, where="Sec")
    message = str(err.value)
    assert "unknown key Sec.steps for widget 'Knob'" in message
    assert "It is a key of: Dial" in message


def test_wrong_type_and_missing_key():
    reg = make_registry()
    with pytest.raises(ConfigError, match=r"wrong type for Sec.size: expected int, got str"):
        reg.build({"name": "Knob", "size": "3"}, where="Sec")
    with pytest.raises(ConfigError, match=r"wrong type for Sec.tags"):
        reg.build({"name": "Knob", "size": 3, "tags": "a"}, where="Sec")
    with pytest.raises(ConfigError, match=r"missing required key\(s\) for widget 'Knob' at Sec: size"):
        reg.build({"name": "Knob"}, where="Sec")
    assert reg.build({"name": "Knob", "size": 3, "ratio": 1}).ratio == 1  # int is a valid float


def test_duplicate_registration_refused():
    reg = make_registry()
    with pytest.raises(KeyError):
        reg.register(type("Knob", (), {}))
