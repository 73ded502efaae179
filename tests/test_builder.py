"""build_component / component_kwargs: the name stripped, shared Global values injected, signature checked."""

import pytest

from ppdist.builder import build_component, component_kwargs
from ppdist.errors import ConfigError
from ppdist.registry import Registry

REGISTRY = Registry("thing")


@REGISTRY.register
class Thing:
    def __init__(self, size: int, num_classes: int = 2, extra: str = "") -> None:
        self.size, self.num_classes, self.extra = size, num_classes, extra


CONFIG = {"Global": {"num_classes": 7, "max_text_length": 25, "ignore_index": None}}


def test_kwargs_take_the_global_values_the_constructor_accepts():
    entry = {"name": "Thing", "size": 3, "num_classes": 4}
    assert component_kwargs(REGISTRY, entry, CONFIG) == {"size": 3, "num_classes": 7}  # Global wins
    assert entry == {"name": "Thing", "size": 3, "num_classes": 4}  # not modified


def test_build_with_framework_arguments_and_checked_keys():
    thing = build_component(REGISTRY, {"name": "Thing", "size": 3}, CONFIG, "Things[0]", extra="x")
    assert (thing.size, thing.num_classes, thing.extra) == (3, 7, "x")
    with pytest.raises(ConfigError, match=r"unknown key Things\[0\]\.sise for thing 'Thing'.*'size'"):
        build_component(REGISTRY, {"name": "Thing", "sise": 3}, CONFIG, "Things[0]")
