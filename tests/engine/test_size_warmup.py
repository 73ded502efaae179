"""Global.cudnn_warmup: every training size visited once before the first step, with no trace in the run."""

import random

import numpy as np
import torch
from ppdist_testing import multi_size_det_config, ppdist_log_records

from ppdist.data.build import train_input_sizes
from ppdist.engine.device_settings import cudnn_autotune
from ppdist.engine.dist import DistEnv
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.engine.setup import build_trainer
from ppdist.engine.size_warmup import synthetic_batch, warm_input_sizes

SIZES = [64, 96, 80]


def det_config(folder, name, *overrides):
    config = multi_size_det_config(folder, name, SIZES, "Global.use_ema=true", *overrides)
    ensure_synthetic_data(config, DistEnv())
    return config


def state_tensors(trainer):
    optimizer = trainer.optimizer.state_dict()["state"]
    return {
        **{f"model.{k}": v for k, v in trainer.model.state_dict().items()},
        **{f"ema.{k}": v for k, v in trainer.ema.state_dict().items() if isinstance(v, torch.Tensor)},
        **{f"opt.{i}.{k}": v for i, s in optimizer.items() for k, v in s.items()},
    }


def test_the_sizes_come_from_the_batch_transform(tmp_path):
    config = det_config(tmp_path, "sizes")
    assert train_input_sizes(config) == [(64, 64), (96, 96), (80, 80)]


def test_unset_cudnn_benchmark_uses_heuristics_for_several_sizes_unless_they_are_warmed():
    assert cudnn_autotune({"cudnn_benchmark": None, "cudnn_warmup": None}, 1) is True
    assert cudnn_autotune({"cudnn_benchmark": None, "cudnn_warmup": None}, 15) is False
    assert cudnn_autotune({"cudnn_benchmark": None, "cudnn_warmup": "all_sizes"}, 15) is True
    assert cudnn_autotune({"cudnn_benchmark": True, "cudnn_warmup": None}, 15) is True
    assert cudnn_autotune({"cudnn_benchmark": False, "cudnn_warmup": "all_sizes"}, 1) is False


def test_warming_visits_every_size_and_leaves_weights_statistics_and_rngs_alone(tmp_path):
    config = det_config(tmp_path, "direct")
    trainer = build_trainer(config, DistEnv())
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    rng = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    seen = []

    def make_batch(size):
        seen.append(size)
        return dict(trainer.to_device(synthetic_batch(config, size, 2)), epoch_id=0)

    visited = warm_input_sizes(trainer.model, trainer.loss_fn, train_input_sizes(config), make_batch)
    assert visited == seen == [(64, 64), (96, 96), (80, 80)]
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(rng[0], torch.get_rng_state()) and (rng[1] == np.random.get_state()[1]).all()
    assert rng[2] == random.getstate()
    assert all(p.grad is None for p in trainer.model.parameters())
    assert trainer.position.global_step == 0
    # the optimizer's state as built: Momentum's zero buffers (ppdist.optim), nothing stepped
    assert all(list(state) == ["momentum_buffer"] for state in trainer.optimizer.state.values())
    assert all(not state["momentum_buffer"].any() for state in trainer.optimizer.state.values())


def test_a_run_with_the_warm_up_equals_one_without_bitwise(tmp_path):
    runs = {}
    for warmup in ("null", "all_sizes"):
        config = det_config(tmp_path, warmup, f"Global.cudnn_warmup={warmup}")
        with ppdist_log_records() as records:
            trainer = build_trainer(config, DistEnv())
        said = [r.getMessage() for r in records if "cudnn_warmup" in r.getMessage()]
        assert said == ([] if warmup == "null" else [said[0]]) and (
            warmup == "null" or "the 3 training" in said[0]
        )
        trainer.train()
        runs[warmup] = state_tensors(trainer)
    assert runs["null"].keys() == runs["all_sizes"].keys() and len(runs["null"]) > 100
    different = [k for k in runs["null"] if not torch.equal(runs["null"][k], runs["all_sizes"][k])]
    assert different == []
