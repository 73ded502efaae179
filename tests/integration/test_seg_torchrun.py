"""PP-LiteSeg end to end under torchrun (gloo, 2 processes): learning and exact distributed eval."""

from __future__ import annotations

import argparse
import json
import os
import re

import pytest
import torch
from ppdist_testing import check_ok, run_tool, tiny_seg_config

from ppdist.cli_seg_eval import add_seg_eval_arguments, override_items, seg_eval_overrides
from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.eval_runner import evaluate_checkpoint

pytestmark = pytest.mark.slow  # a torchrun training or launch: outside the edit loop (README)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("seg")
    data = str(root / "data")
    cfg = tiny_seg_config(str(root / "tiny_seg.yml"), data, str(root / "out"), max_iters=150)
    result = check_ok(run_tool(["train.py", "-c", cfg], nproc=2))
    return {"cfg": cfg, "out": str(root / "out"), "root": root, "stdout": result.stdout}


def test_two_process_training_learns_iteration_based(trained):
    with open(os.path.join(trained["out"], "train.log"), encoding="utf-8") as handle:
        log = handle.read()
    assert re.search(
        r"global_step: 150, lr: [\d.]+, loss: [\d.]+, loss_0: [\d.]+, loss_1: [\d.]+, loss_2: [\d.]+, "
        r".*avg_samples: 16, ips: [\d.]+ samples/s, eta: ",
        log,
    ), log[-2000:]
    best = torch.load(os.path.join(trained["out"], "best_accuracy.pt"), weights_only=True)
    assert best["position"]["global_step"] == 150 and best["position"]["world_size"] == 2
    metrics = best["metrics"]
    # chance level: mIoU of a constant "background" prediction is about 0.2 on this data
    assert metrics["miou"] > 0.6, metrics
    assert metrics["images"] == 37


def test_eval_one_and_two_processes_agree_exactly_on_odd_val_set(trained):
    ckpt = os.path.join(trained["out"], "best_accuracy")
    out1, out2 = str(trained["root"] / "m1.json"), str(trained["root"] / "m2.json")
    overrides = [f"Global.checkpoints={ckpt}", "Eval.loader.batch_size_per_card=3"]
    check_ok(run_tool(["eval.py", "-c", trained["cfg"], "-o", *overrides, "--output_json", out1]))
    check_ok(run_tool(["eval.py", "-c", trained["cfg"], "-o", *overrides, "--output_json", out2], nproc=2))
    with open(out1) as a, open(out2) as b:
        single, double = json.load(a), json.load(b)
    assert single == double and single["images"] == 37  # batches of 3: shards of 21 and 16 images
    assert single == torch.load(ckpt + ".pt", weights_only=True)["metrics"]


def test_test_time_flip_and_slide_eval_one_and_two_processes_agree_exactly(trained):
    """PaddleSeg's test_config (scales + flip + sliding windows) in tools/eval.py under 2 processes
    (set with -o PostProcess.*) gives exactly the metrics of one process (the same evaluation in
    this process, set with PaddleSeg val.py's flags, 1 thread as torchrun's ranks): each image is
    evaluated whole by one process."""
    ckpt = os.path.join(trained["out"], "best_accuracy")
    common = [f"Global.checkpoints={ckpt}", "Eval.loader.batch_size_per_card=3", "Eval.loader.num_workers=0"]
    as_overrides = [
        "PostProcess.aug_eval=true",
        "PostProcess.scales=[0.75,1.0]",
        "PostProcess.flip_horizontal=true",
        "PostProcess.flip_vertical=false",
        "PostProcess.is_slide=true",
        "PostProcess.crop_size=[48,40]",
        "PostProcess.stride=[32,24]",
    ]
    out = str(trained["root"] / "aug2.json")
    check_ok(
        run_tool(
            ["eval.py", "-c", trained["cfg"], "-o", *common, *as_overrides, "--output_json", out], nproc=2
        )
    )
    with open(out) as handle:
        double = json.load(handle)
    parser = argparse.ArgumentParser()
    add_seg_eval_arguments(parser)
    flags = parser.parse_args(
        ["--aug_eval", "--scales", "0.75", "1.0", "--flip_horizontal", "--is_slide"]
        + ["--crop_size", "48", "40", "--stride", "32", "24"]
    )
    config = load_config(trained["cfg"], common + override_items(seg_eval_overrides(flags)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = json.loads(json.dumps(evaluate_checkpoint(config, DistEnv())))
    finally:
        torch.set_num_threads(threads)
    assert single == double and single["images"] == 37 and single["miou"] > 0.5
    plain = torch.load(ckpt + ".pt", weights_only=True)["metrics"]
    assert single["miou"] != plain["miou"]  # the test-time options did change the predictions
