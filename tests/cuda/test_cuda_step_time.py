"""On a GPU: the cuDNN setting of a multi-scale recipe, the size warm-up, and --step_time's profile."""

import torch
from ppdist_testing import multi_size_det_config, ppdist_log_records

from ppdist.benchmark.step_time import measure_step_time
from ppdist.engine.dist import DistEnv
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.engine.setup import build_trainer

SIZES = [64, 96, 80]
CUDA = torch.device("cuda")


def det_config(folder, name, *overrides):
    config = multi_size_det_config(folder, name, SIZES, *overrides)
    ensure_synthetic_data(config, DistEnv())
    return config


def test_several_sizes_use_heuristics_unless_warmed(tmp_path):
    build_trainer(det_config(tmp_path, "heuristics"), DistEnv(device=CUDA))
    assert torch.backends.cudnn.benchmark is False
    with ppdist_log_records() as records:
        trainer = build_trainer(
            det_config(tmp_path, "warmed", "Global.cudnn_warmup=all_sizes"), DistEnv(device=CUDA)
        )
    assert torch.backends.cudnn.benchmark is True
    assert any("visited the 3 training input sizes" in r.getMessage() for r in records)
    trainer.train()  # the warmed run trains on
    assert trainer.position.global_step == 3


def test_step_time_profiles_kernels_on_cuda(tmp_path):
    config = det_config(tmp_path, "steps")
    record = measure_step_time(config, 2, (64, 64), CUDA, warmup=1, iters=3, profile_steps=1)
    assert record["cudnn_benchmark"] is False  # the recipe's setting: heuristics for 3 sizes
    assert record["kernels_per_step"] > 100 and record["top_kernels"]
    assert 0 < record["gpu_busy_pct"] and record["max_mem_gib"] > 0
    assert record["samples_per_s"] > 0 and record["issue_ms"] > 0
