"""The benchmark's trainer and bare loop visit every training size of a multi-scale recipe once
before their timed steps (cuDNN's autotuning and per-shape caches stay out of the window)."""

import pytest
from ppdist_testing import tiny_det_config

from ppdist.benchmark.measurements import load_batches, measure_bare_loop, measure_trainer, training_config
from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.prepare import ensure_synthetic_data

SIZES = [64, 96, 80]


@pytest.mark.slow
def test_the_warm_up_visits_the_recipes_size_list(tmp_path):
    path = tiny_det_config(str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "o"), num_train=16)
    config = load_config(
        path,
        [
            f"Train.dataset.batch_transforms.0.BatchRandomResize.target_size={SIZES}",
            "Train.loader.batch_size_per_card=2",
            "Train.loader.num_workers=0",
        ],
    )
    ensure_synthetic_data(config, DistEnv())
    train_cfg = training_config(config, 1, 2, str(tmp_path / "bench"))
    batches, loader = load_batches(train_cfg, 3, 1, DistEnv().device)
    bare = measure_bare_loop(train_cfg, DistEnv().device, batches, 1, loader["steps_per_epoch"])
    trainer = measure_trainer(train_cfg, DistEnv(), 1, 2)
    expected = [[s, s] for s in SIZES]
    assert bare["warmed_sizes"] == expected and trainer["warmed_sizes"] == expected
    assert bare["steps"] == trainer["steps"] == 2 and bare["samples"] == trainer["samples"] == 4
