"""``Global.cuda_graph`` under torchrun (2 processes, gloo, SyncBatchNorm): the captured step
(after DDP's 11 eager steps; the op-by-op replay on the CPU, each collective waited for as a CUDA
stream orders it) trains to the same weights as the eager step, bit for bit."""

import pytest
import torch
from ppdist_testing import check_ok, run_tool, tiny_seg_config


@pytest.mark.slow
def test_two_processes_captured_equal_two_processes_eager(tmp_path):
    weights = {}
    for name, setting in (("eager", "false"), ("captured", "true")):
        config = tiny_seg_config(
            str(tmp_path / f"{name}.yml"), str(tmp_path / "data"), str(tmp_path / name), 24
        )
        result = check_ok(
            run_tool(
                ["train.py", "-c", config, "-o", f"Global.cuda_graph={setting}", "Optimizer.fused=true"],
                nproc=2,
            )
        )
        if setting == "true":
            assert "captured after 11 eager steps" in result.stdout + result.stderr
        weights[name] = torch.load(tmp_path / name / "latest.pt", weights_only=True)["model"]
    for key, value in weights["eager"].items():
        assert torch.equal(value, weights["captured"][key]), key
