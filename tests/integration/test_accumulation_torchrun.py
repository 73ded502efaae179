"""N processes x K accumulation steps train the model of N * K processes (Global.accumulate_steps).

Under torchrun (gloo): 2 processes, no accumulation, against 1 process accumulating 2 micro-batches,
same config and seed. The trainable weights (and the EMA's) are equal up to float rounding: the
same samples with the same augmentation make each step, CTC's batch mean and PP-YOLOE's
all-reduced normaliser (here in the TAL phase) come out the same, and the LR schedule counts
optimizer steps. BatchNorm running statistics differ by design: the 2-process run keeps rank
0's (updated by its batches only), the accumulating process updates them with both micro-batches.
PP-YOLOE runs without SyncBN here: synchronised, the 2 processes normalise by the statistics of
both batches, where one process accumulating normalises each micro-batch by its own.
"""

from __future__ import annotations

import pytest
import torch
from ppdist_testing import check_ok, run_tool, tiny_config, tiny_det_config

pytestmark = pytest.mark.slow  # a torchrun training or launch: outside the edit loop (README)

RUNS = {
    "crnn": (tiny_config, ["Global.max_iters=6", "Global.eval_batch_epoch=null"]),
    "ppyoloe": (
        tiny_det_config,
        [
            "Global.max_iters=4",
            "Global.eval_batch_epoch=null",
            "Loss.static_assigner_epoch=0",
            "Global.use_sync_bn=false",
        ],
    ),
}
STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


@pytest.mark.parametrize("task", sorted(RUNS))
def test_one_process_accumulating_two_steps_equals_two_processes(tmp_path, task):
    make_config, overrides = RUNS[task]
    data = str(tmp_path / "data")
    finals = {}
    for name, nproc, accumulate in (("two_processes", 2, 1), ("accumulating", None, 2)):
        cfg = make_config(str(tmp_path / f"{name}.yml"), data, str(tmp_path / name))
        args = ["train.py", "-c", cfg, "-o", *overrides, f"Global.accumulate_steps={accumulate}"]
        check_ok(run_tool(args + ["Train.loader.num_workers=0"], nproc=nproc))
        finals[name] = torch.load(tmp_path / name / "latest.pt", weights_only=True)
    two, one = finals["two_processes"], finals["accumulating"]
    assert two["position"]["global_step"] == one["position"]["global_step"]
    assert one["position"]["accumulate_steps"] == 2 and two["position"]["world_size"] == 2
    assert two["scheduler"] == one["scheduler"]
    compared = 0
    for key, value in two["model"].items():
        if key.endswith(STATISTICS):
            continue
        torch.testing.assert_close(one["model"][key], value, rtol=2e-5, atol=2e-7, msg=key)
        compared += 1
    assert compared > 50
    if two["ema"]:
        for key, value in two["ema"]["module"].items():
            if not key.endswith(STATISTICS):
                torch.testing.assert_close(one["ema"]["module"][key], value, rtol=2e-5, atol=2e-7, msg=key)
