"""NCCL under torchrun on the GPUs there are (1 process, or 2 with two GPUs): DDP with SyncBN and
EMA trains, N-process evaluation equals 1-process evaluation, and the benchmark runs on CUDA."""

import json
import os

import pytest
import torch
from ppdist_testing import check_ok, run_tool, tiny_det_config, tiny_seg_config

NPROC = min(2, torch.cuda.device_count()) if torch.cuda.is_available() else 1
MAKERS = {"det": tiny_det_config, "seg": tiny_seg_config}


@pytest.mark.parametrize("task", sorted(MAKERS))
def test_nccl_training_with_sync_bn_and_exact_eval(tmp_path, task):
    cfg = MAKERS[task](str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    options = ["Global.use_sync_bn=true", "Global.use_amp=true", "Global.amp_dtype=bfloat16"]
    result = check_ok(run_tool(["train.py", "-c", cfg, "-o", *options], nproc=NPROC))
    assert "nccl" in result.stdout.lower() or NPROC == 1, result.stdout[-3000:]
    best = torch.load(os.path.join(tmp_path, "out", "latest.pt"), weights_only=True)
    assert best["position"]["world_size"] == NPROC
    metrics = []
    for nproc, name in ((None, "one.json"), (NPROC, "n.json")):
        out = str(tmp_path / name)
        check_ok(
            run_tool(
                [
                    "eval.py",
                    "-c",
                    cfg,
                    "-o",
                    f"Global.checkpoints={tmp_path / 'out' / 'latest'}",
                    "--output_json",
                    out,
                    "--output_dir",
                    str(tmp_path / name.split(".")[0]),
                ],
                nproc=nproc,
            )
        )
        with open(out, encoding="utf-8") as handle:
            metrics.append(json.load(handle))
    assert metrics[0] == metrics[1]


def test_benchmark_tool_on_cuda(tmp_path):
    out = str(tmp_path / "bench.json")
    check_ok(
        run_tool(
            [
                "benchmark.py",
                "-c",
                os.path.join("configs", "det", "quickstart_synth.yml"),
                "--iters",
                "20",
                "--warmup",
                "5",
                "--skip",
                "scaling",
                "infer",
                "--json",
                out,
                "--output_dir",
                str(tmp_path / "bench"),
            ]
        )
    )
    with open(out, encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["environment"]["cuda"] is not None, report["environment"]
    assert report["trainer"]["samples_per_s"] > 0 and report["bare_loop"]["samples_per_s"] > 0
