"""The shared trainer in-process (1 process): mid-epoch resume, bad samples, logging, schedules."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
from ppdist_testing import tiny_config

from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.trainer import Trainer
from ppdist.errors import DataError


def config_for(tmp_path, data_dir, save="out", overrides=(), **global_extra):
    path = tiny_config(
        str(tmp_path / f"{save}.yml"), data_dir, str(tmp_path / save), epochs=2, **global_extra
    )
    overrides = [
        "Train.loader.num_workers=0",
        "Global.synthetic_data=null",
        "Global.print_batch_step=5",
    ] + list(overrides)
    return load_config(path, overrides)


class SnapshotTrainer(Trainer):
    """Copies best_accuracy.pt the first time it is written (a mid-epoch checkpoint here)."""

    snapshot = None

    def save(self, name, extra=None):
        super().save(name, extra)
        if name == "best_accuracy" and SnapshotTrainer.snapshot is None:
            SnapshotTrainer.snapshot = os.path.join(self.save_dir, "snapshot.pt")
            shutil.copy(os.path.join(self.save_dir, "best_accuracy.pt"), SnapshotTrainer.snapshot)


def test_mid_epoch_resume_matches_uninterrupted_run(tmp_path, digits_dir):
    setup_logger(None)
    # 512 samples / 16 = 32 batches per epoch; eval (and best_accuracy) at step 12, mid-epoch 1
    cfg = config_for(
        tmp_path, digits_dir, "full", ["Global.eval_batch_epoch=null", "Global.eval_batch_step=[0,12]"]
    )
    SnapshotTrainer.snapshot = None
    full = SnapshotTrainer(cfg, DistEnv())
    full.train()
    snap = torch.load(SnapshotTrainer.snapshot, weights_only=True)
    assert (snap["next_epoch"], snap["next_batch"], snap["global_step"]) == (1, 12, 12)

    cfg2 = config_for(
        tmp_path,
        digits_dir,
        "resumed",
        [
            "Global.eval_batch_epoch=null",
            "Global.eval_batch_step=[0,12]",
            f"Global.checkpoints={SnapshotTrainer.snapshot}",
        ],
    )
    resumed = Trainer(cfg2, DistEnv())
    assert resumed.global_step == 12 and resumed.scheduler.last_step == 12
    resumed.train()
    assert resumed.global_step == full.global_step == 64
    for key, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    assert resumed.best == full.best


def test_auto_checkpoint_ema_and_tensorboard(tmp_path, digits_dir):
    setup_logger(None)
    extra = dict(checkpoints="auto", use_ema=True, ema_decay=0.9, use_tensorboard=True)
    cfg = config_for(tmp_path, digits_dir, "auto", ["Global.epoch_num=1"], **extra)
    first = Trainer(cfg, DistEnv())
    assert first.global_step == 0
    first.train()
    latest = torch.load(tmp_path / "auto" / "latest.pt", weights_only=True)
    assert latest["ema"]["step"] == 32
    ema_weight = latest["ema"]["module"]["head.fc.weight"]
    assert not torch.equal(ema_weight, latest["model"]["head.fc.weight"])  # eval/saving use the average
    assert any(
        name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "auto" / "tensorboard")
    )
    again = Trainer(config_for(tmp_path, digits_dir, "auto", ["Global.epoch_num=1"], **extra), DistEnv())
    assert again.global_step == 32 and again.next_epoch == 2 and again.ema.step == 32
    again.train()  # nothing left to do: returns at once
    assert again.global_step == 32


def test_bad_samples_are_named_counted_and_limited(tmp_path, digits_dir, caplog):
    data = tmp_path / "bad"
    shutil.copytree(digits_dir, data)
    with open(data / "train.txt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    lines[3] = "images/train/missing.jpg\t123"
    lines[7] = lines[7].split("\t")[0] + "\t###"  # no character of the dictionary
    with open(data / "train.txt", "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    setup_logger(None)
    logging.getLogger("ppdist").propagate = True
    cfg = config_for(tmp_path, str(data), "badrun", ["Global.epoch_num=1", "Global.eval_batch_epoch=null"])
    with caplog.at_level(logging.WARNING, logger="ppdist"):
        Trainer(cfg, DistEnv()).train()
    text = caplog.text
    assert "train.txt:4" in text and "missing.jpg" in text
    assert "train.txt:8" in text
    assert "epoch summary: 2 bad training sample(s) of 512" in text
    cfg = config_for(
        tmp_path, str(data), "badrun2", ["Global.epoch_num=1", "Global.max_bad_sample_ratio=0.001"]
    )
    with pytest.raises(
        DataError, match=r"2 of \d+ training samples this epoch were bad .*max_bad_sample_ratio"
    ):
        Trainer(cfg, DistEnv()).train()
    logging.getLogger("ppdist").propagate = False


def test_missing_label_file_names_the_path(tmp_path, digits_dir):
    from ppdist.errors import PPDistError

    cfg = config_for(
        tmp_path, digits_dir, "nolabel", [f"Train.dataset.label_file_list=[{tmp_path}/nope.txt]"]
    )
    with pytest.raises(PPDistError, match="nope.txt"):
        Trainer(cfg, DistEnv())


def test_pretrained_weights_seed_the_model_and_its_ema(tmp_path, digits_dir):
    from ppdist.engine.checkpoint import save_atomic

    setup_logger(None)
    source = Trainer(config_for(tmp_path, digits_dir, "src", ["Global.seed=5"]), DistEnv())
    save_atomic({"model": source.model.state_dict()}, str(tmp_path / "weights.pt"))
    target = Trainer(
        config_for(
            tmp_path, digits_dir, "dst", [f"Global.pretrained_model={tmp_path}/weights"], use_ema=True
        ),
        DistEnv(),
    )
    for key, value in source.model.state_dict().items():
        assert torch.equal(target.model.state_dict()[key], value), key
        assert torch.equal(target.ema.module.state_dict()[key], value), key
    assert target.global_step == 0 and target.scheduler.last_step == 0  # weights only, no resume


class SaveRecorder(Trainer):
    """Records (name, global_step, position) of every checkpoint written."""

    def save(self, name, extra=None):
        super().save(name, extra)
        self.saves = getattr(self, "saves", []) + [
            (name, self.global_step, self.next_epoch, self.next_batch, self.epoch_consumed)
        ]


def test_save_iter_step_writes_latest_mid_epoch(tmp_path, digits_dir):
    setup_logger(None)
    cfg = config_for(
        tmp_path,
        digits_dir,
        "iters",
        ["Global.epoch_num=1", "Global.eval_batch_epoch=null"],
        save_iter_step=10,
    )
    trainer = SaveRecorder(cfg, DistEnv())
    trainer.train()
    latest = [s for s in trainer.saves if s[0] == "latest"]
    # every 10 steps mid-epoch with the sample position, then the end of the 32-step epoch
    assert latest[:4] == [
        ("latest", 10, 1, 10, 160),
        ("latest", 20, 1, 20, 320),
        ("latest", 30, 1, 30, 480),
        ("latest", 32, 2, 0, 0),
    ]
    stored = torch.load(tmp_path / "iters" / "latest.pt", weights_only=True)
    assert (stored["dataset_len"], stored["batch_size_per_card"], stored["epoch_consumed"]) == (512, 16, 0)


def test_resume_with_another_batch_layout_needs_auto_scale_lr_and_continues_the_epoch(tmp_path, digits_dir):
    from ppdist.errors import CheckpointError

    setup_logger(None)
    cfg = config_for(
        tmp_path, digits_dir, "first", ["Global.eval_batch_epoch=null", "Global.eval_batch_step=[0,12]"]
    )
    SnapshotTrainer.snapshot = None
    SnapshotTrainer(cfg, DistEnv()).train()  # snapshot at step 12: epoch 1, 12 x 16 = 192 samples used
    resume = [
        "Global.eval_batch_epoch=null",
        f"Global.checkpoints={SnapshotTrainer.snapshot}",
        "Train.loader.batch_size_per_card=8",
    ]
    with pytest.raises(CheckpointError, match=r"Global.auto_scale_lr: \{base_batch_size: N\}"):
        Trainer(config_for(tmp_path, digits_dir, "refused", resume), DistEnv())

    scaled = config_for(
        tmp_path, digits_dir, "scaled", resume + ["Global.auto_scale_lr={base_batch_size: 16}"]
    )
    trainer = Trainer(scaled, DistEnv())
    assert trainer.lr_factor == 0.5 and trainer.scheduler.schedule.base_lr == pytest.approx(0.001)
    # 512 - 192 = 320 samples left in epoch 1 = 40 batches of 8; the epoch has 64 such batches
    assert (trainer.next_epoch, trainer.epoch_consumed, trainer.next_batch, trainer.global_step) == (
        1,
        192,
        24,
        24,
    )
    assert trainer.scheduler.last_step == 24
    trainer.train()
    assert trainer.global_step == 2 * 64


def test_auto_scale_lr_scales_every_learning_rate_of_the_schedule():
    from ppdist.engine.optim import scale_learning_rates

    cfg = {
        "name": "PolynomialDecay",
        "learning_rate": 0.01,
        "end_lr": 0.001,
        "warmup_start_lr": 1e-5,
        "power": 0.9,
    }
    assert scale_learning_rates(cfg, 2.0) == {
        "name": "PolynomialDecay",
        "learning_rate": 0.02,
        "end_lr": 0.002,
        "warmup_start_lr": 2e-5,
        "power": 0.9,
    }
    assert scale_learning_rates({"name": "Piecewise", "values": [0.1, 0.01], "decay_epochs": [3]}, 0.5)[
        "values"
    ] == [0.05, 0.005]
    assert scale_learning_rates(0.001, 4) == 0.004


def test_compile_trains_like_eager_and_saves_plain_weights(tmp_path, digits_dir):
    """Global.compile wraps the training forward only: same losses and weights as eager, and
    checkpoints keep the model's own names. (aot_eager traces like inductor, minus code
    generation, which keeps the test fast; inductor is measured in docs/benchmarks.md.)"""
    setup_logger(None)
    common = ["Global.max_iters=4", "Global.eval_batch_epoch=null", "Global.eval_batch_step=[0,1000]"]
    eager = Trainer(config_for(tmp_path, digits_dir, "eager", common), DistEnv())
    eager.train()
    compiled_cfg = config_for(
        tmp_path, digits_dir, "compiled", common + ["Global.compile={backend: aot_eager}"]
    )
    compiled = Trainer(compiled_cfg, DistEnv())
    assert compiled.ddp_model is not compiled.model and hasattr(compiled.ddp_model, "_orig_mod")
    compiled.train()
    saved = torch.load(tmp_path / "compiled" / "latest.pt", weights_only=True)["model"]
    assert set(saved) == set(eager.model.state_dict())
    for name, tensor in eager.model.state_dict().items():
        torch.testing.assert_close(saved[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def test_gradient_as_bucket_view_defaults_per_device():
    from ppdist.engine.trainer import gradient_as_bucket_view

    assert gradient_as_bucket_view({"gradient_as_bucket_view": None}, torch.device("cpu")) is False
    assert gradient_as_bucket_view({"gradient_as_bucket_view": None}, torch.device("cuda", 0)) is True
    assert gradient_as_bucket_view({"gradient_as_bucket_view": True}, torch.device("cpu")) is True
