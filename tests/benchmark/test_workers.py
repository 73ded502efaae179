"""tools/benchmark.py --workers: loader workers sized from the node's cores per training process."""

import pytest

from ppdist.benchmark import workers
from ppdist.errors import ConfigError

CONFIG = {"Train": {"loader": {"num_workers": 4, "batch_size_per_card": 2}}}


@pytest.mark.parametrize(
    "cores, processes, expected", [(16, 1, 15), (16, 2, 7), (16, 8, 1), (2, 1, 1), (1, 4, 1)]
)
def test_auto_is_the_cores_per_process_minus_its_own(monkeypatch, cores, processes, expected):
    monkeypatch.setattr(workers, "node_cores", lambda: cores)
    assert workers.loader_workers("auto", CONFIG, processes) == expected


def test_config_keeps_the_recipe_and_a_count_sets_it():
    assert workers.loader_workers("config", CONFIG, 1) == 4
    assert workers.loader_workers("0", CONFIG, 1) == 0
    changed = workers.with_workers(CONFIG, 6)
    assert changed["Train"]["loader"] == {"num_workers": 6, "batch_size_per_card": 2}
    assert CONFIG["Train"]["loader"]["num_workers"] == 4  # the caller's config is left alone
    with pytest.raises(ConfigError, match="--workers must be 'auto', 'config' or a count"):
        workers.loader_workers("many", CONFIG, 1)
