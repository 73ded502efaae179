"""NCCL on two GPUs (skipped with fewer): the detection recipe's model trains through
``Trainer.train`` with SyncBN, DDP, EMA, its hooks and multi-scale inputs while the device refuses
every synchronising call on the non-logging steps after warm-up; tools/train.py under torchrun logs
its process group (nccl) and SyncBatchNorm layers; N-process evaluation equals 1-process evaluation."""

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from ppdist_testing import check_ok, run_tool, tiny_det_config, tiny_seg_config

from ppdist.config import load_config
from ppdist.engine.dist import DistEnv, cleanup, init_distributed
from ppdist.engine.hooks import Hook
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.engine.setup import build_trainer

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
NPROC = 2
MAKERS = {"det": tiny_det_config, "seg": tiny_seg_config}
PRECISIONS = {
    "fp32": ["Global.use_amp=false"],
    "bf16": ["Global.use_amp=true", "Global.amp_dtype=bfloat16"],
}
pytestmark = pytest.mark.skipif(GPUS < NPROC, reason=f"needs {NPROC} CUDA GPUs (found {GPUS})")


class SyncFreeSteps(Hook):
    """Puts the device in ``set_sync_debug_mode("error")`` for every step after ``warmup`` but the
    logging ones (a host read there raises inside the step), and out of it before any other hook."""

    name = "sync_free_steps"
    priority = -100

    def __init__(self, warmup: int, period: int) -> None:
        self.warmup, self.period, self.checked = warmup, period, []

    def before_step(self) -> None:
        step = self.trainer.position.global_step + 1
        if step > self.warmup and step % self.period and step < self.trainer.total_steps:
            torch.cuda.set_sync_debug_mode("error")
            self.checked.append(step)

    def after_step(self) -> None:
        torch.cuda.set_sync_debug_mode("default")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_worker(rank, port, config, out_path):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(NPROC),
    )
    env = init_distributed(use_gpu=True, timeout_s=300)
    try:
        hook = SyncFreeSteps(warmup=3, period=config["Global"]["print_batch_step"])
        trainer = build_trainer(config, env, hooks=[hook])
        trainer.train()
        loss = float(trainer.last_step.values["loss"])
        torch.save({"checked": hook.checked, "loss": loss, "backend": env.backend}, f"{out_path}.{rank}")
    finally:
        cleanup(env)


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_det_recipe_model_trains_sync_free_on_two_gpus(tmp_path, precision):
    """PP-YOLOE-s (width 0.5, depth 0.33) at 96-160 px, 4 sizes, SyncBN + DDP + EMA + hooks."""
    path = tiny_det_config(
        str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"), num_train=128
    )
    options = [
        "Global.width_mult=0.5",
        "Global.depth_mult=0.33",
        "Global.max_iters=12",
        "Global.print_batch_step=5",
        "Global.eval_during_train=false",
        "Global.use_sync_bn=true",
        "Global.use_ema=true",
        "Train.dataset.batch_transforms.0.BatchRandomResize.target_size=[96,128,160,192]",
        "Train.loader.num_workers=2",
        *PRECISIONS[precision],
    ]
    config = load_config(path, options)
    ensure_synthetic_data(config, DistEnv())
    out = str(tmp_path / "result")
    mp.spawn(train_worker, args=(free_port(), config, out), nprocs=NPROC)
    for rank in range(NPROC):
        result = torch.load(f"{out}.{rank}", weights_only=False)
        assert result["backend"] == "nccl"
        assert result["checked"] == [4, 6, 7, 8, 9, 11], result  # steps that ran in error mode
        assert result["loss"] == result["loss"] and abs(result["loss"]) < 1e6


@pytest.mark.parametrize("task", sorted(MAKERS))
def test_nccl_training_with_sync_bn_and_exact_eval(tmp_path, task):
    cfg = MAKERS[task](str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    options = ["Global.use_sync_bn=true", "Global.use_amp=true", "Global.amp_dtype=bfloat16"]
    check_ok(run_tool(["train.py", "-c", cfg, "-o", *options], nproc=NPROC))
    log = open(tmp_path / "out" / "train.log", encoding="utf-8").read()
    assert f"{NPROC} process(es) (process group: nccl), device cuda:0" in log
    assert " SyncBatchNorm layers" in log
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
