"""The shared trainer in-process (1 process): mid-epoch resume, bad samples, logging, schedules."""
from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch

from ppdist.config import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.trainer import Trainer
from ppdist.errors import DataError
from ppdist_testing import tiny_config


def config_for(tmp_path, data_dir, save="out", overrides=(), **global_extra):
    path = tiny_config(str(tmp_path / f"{save}.yml"), data_dir, str(tmp_path / save), epochs=2, **global_extra)
    overrides = ["Train.loader.num_workers=0", "Global.synthetic_data=null", "Global.print_batch_step=5"] + list(overrides)
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
    cfg = config_for(tmp_path, digits_dir, "full", ["Global.eval_batch_epoch=null", "Global.eval_batch_step=[0,12]"])
    SnapshotTrainer.snapshot = None
    full = SnapshotTrainer(cfg, DistEnv())
    full.train()
    snap = torch.load(SnapshotTrainer.snapshot, weights_only=True)
    assert (snap["next_epoch"], snap["next_batch"], snap["global_step"]) == (1, 12, 12)

    cfg2 = config_for(tmp_path, digits_dir, "resumed", ["Global.eval_batch_epoch=null", "Global.eval_batch_step=[0,12]",
                                                       f"Global.checkpoints={SnapshotTrainer.snapshot}"])
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
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "auto" / "tensorboard"))
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
    cfg = config_for(tmp_path, str(data), "badrun2", ["Global.epoch_num=1", "Global.max_bad_sample_ratio=0.001"])
    with pytest.raises(DataError, match=r"2 of \d+ training samples this epoch were bad .*max_bad_sample_ratio"):
        Trainer(cfg, DistEnv()).train()
    logging.getLogger("ppdist").propagate = False


def test_missing_label_file_names_the_path(tmp_path, digits_dir):
    from ppdist.errors import PPDistError

    cfg = config_for(tmp_path, digits_dir, "nolabel", [f"Train.dataset.label_file_list=[{tmp_path}/nope.txt]"])
    with pytest.raises(PPDistError, match="nope.txt"):
        Trainer(cfg, DistEnv())


def test_pretrained_weights_seed_the_model_and_its_ema(tmp_path, digits_dir):
    from ppdist.engine.checkpoint import save_atomic

    setup_logger(None)
    source = Trainer(config_for(tmp_path, digits_dir, "src", ["Global.seed=5"]), DistEnv())
    save_atomic({"model": source.model.state_dict()}, str(tmp_path / "weights.pt"))
    target = Trainer(config_for(tmp_path, digits_dir, "dst", [f"Global.pretrained_model={tmp_path}/weights"],
                                use_ema=True), DistEnv())
    for key, value in source.model.state_dict().items():
        assert torch.equal(target.model.state_dict()[key], value), key
        assert torch.equal(target.ema.module.state_dict()[key], value), key
    assert target.global_step == 0 and target.scheduler.last_step == 0  # weights only, no resume
