"""Global.profiler_options on CUDA: the trace holds the window's GPU kernels, the table is sorted
by device time."""

import json

import torch
from ppdist_testing import tiny_run_config

from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer


def test_the_trace_holds_the_windows_cuda_kernels(tmp_path, digits_dir):
    setup_logger(None)
    folder = tmp_path / "prof"
    options = f"batch_range=[2,4];state=GPU;profile_path={folder}"
    config = tiny_run_config(
        tmp_path, digits_dir, "p", ["Global.use_gpu=true", f"Global.profiler_options='{options}'"]
    )
    trainer = build_trainer(config, DistEnv(device=torch.device("cuda", 0)))
    assert trainer.env.device.type == "cuda"
    trainer.train()
    assert trainer.position.global_step == 4
    (trace,) = trainer.hook("profiler").trace_files
    with open(trace, encoding="utf-8") as handle:
        events = json.load(handle)["traceEvents"]
    assert {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")} == {
        "ProfilerStep#2",
        "ProfilerStep#3",
    }
    assert any(e.get("cat") == "kernel" for e in events)
    assert "CUDA" in (folder / "rank0.key_averages.txt").read_text()  # device-time columns
