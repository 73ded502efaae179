"""The shared trainer in-process (1 process): mid-epoch resume, bad samples, logging, schedules."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
from ppdist_testing import ppdist_log_records
from ppdist_testing import tiny_run_config as config_for

from ppdist.engine import setup
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer
from ppdist.errors import CheckpointError, ConfigError, DataError

HALF = "Train.dataset.ratio_list=[0.5]"  # 256 of the 512 training samples each epoch


def snapshot_first_best(trainer):
    """Makes ``trainer`` copy best_accuracy.pt to snapshot.pt the first time it is written (a
    mid-epoch checkpoint here; the background write waited for); returns the snapshot's path."""
    snapshot = os.path.join(trainer.save_dir, "snapshot.pt")
    save = trainer.save

    def save_and_copy(name, extra=None, **more):
        save(name, extra, **more)
        if name == "best_accuracy" and not os.path.exists(snapshot):
            trainer.wait_for_checkpoints()
            shutil.copy(os.path.join(trainer.save_dir, "best_accuracy.pt"), snapshot)

    trainer.save = save_and_copy
    return snapshot


@pytest.mark.slow
def test_mid_epoch_resume_matches_uninterrupted_run(tmp_path, digits_dir):
    setup_logger(None)
    # half of the 512 samples (ratio_list) / 16 = 16 batches per epoch; eval (and best_accuracy)
    # at step 12, mid-epoch 1; the resumed run crosses into epoch 2
    every_12 = ["Global.eval_batch_epoch=null", "Global.eval_batch_step=[0,12]", HALF]
    cfg = config_for(tmp_path, digits_dir, "full", every_12)
    full = build_trainer(cfg, DistEnv())
    snapshot = snapshot_first_best(full)
    full.train()
    snap = torch.load(snapshot, weights_only=True)["position"]
    assert (snap["next_epoch"], snap["next_batch"], snap["global_step"]) == (1, 12, 12)

    cfg2 = config_for(
        tmp_path,
        digits_dir,
        "resumed",
        every_12 + [f"Global.checkpoints={snapshot}"],
    )
    resumed = build_trainer(cfg2, DistEnv())
    assert resumed.position.global_step == 12 and resumed.scheduler.last_step == 12
    resumed.train()
    assert resumed.position.global_step == full.position.global_step == 32
    for key, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    assert resumed.hook("evaluation").best == full.hook("evaluation").best


@pytest.mark.slow
def test_auto_checkpoint_ema_and_tensorboard(tmp_path, digits_dir):
    setup_logger(None)
    extra = dict(checkpoints="auto", use_ema=True, ema_decay=0.9, use_tensorboard=True)
    cfg = config_for(tmp_path, digits_dir, "auto", ["Global.epoch_num=1"], **extra)
    first = build_trainer(cfg, DistEnv())
    assert first.position.global_step == 0
    first.train()
    latest = torch.load(tmp_path / "auto" / "latest.pt", weights_only=True)
    assert latest["ema"]["step"] == 32
    ema_weight = latest["ema"]["module"]["head.fc.weight"]
    assert not torch.equal(ema_weight, latest["model"]["head.fc.weight"])  # eval/saving use the average
    assert any(
        name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "auto" / "tensorboard")
    )
    again = build_trainer(
        config_for(tmp_path, digits_dir, "auto", ["Global.epoch_num=1"], **extra), DistEnv()
    )
    assert again.position.global_step == 32 and again.position.next_epoch == 2 and again.ema.step == 32
    again.train()  # nothing left to do: returns at once
    assert again.position.global_step == 32


@pytest.mark.slow
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
        build_trainer(cfg, DistEnv()).train()
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
        build_trainer(cfg, DistEnv()).train()
    logging.getLogger("ppdist").propagate = False


def test_missing_label_file_names_the_path(tmp_path, digits_dir):
    from ppdist.errors import PPDistError

    cfg = config_for(
        tmp_path, digits_dir, "nolabel", [f"Train.dataset.label_file_list=[{tmp_path}/nope.txt]"]
    )
    with pytest.raises(PPDistError, match="nope.txt"):
        build_trainer(cfg, DistEnv())


def test_pretrained_weights_seed_the_model_and_its_ema(tmp_path, digits_dir):
    from ppdist.engine.checkpoint import save_atomic

    setup_logger(None)
    source = build_trainer(config_for(tmp_path, digits_dir, "src", ["Global.seed=5"]), DistEnv())
    save_atomic({"model": source.model.state_dict()}, str(tmp_path / "weights.pt"))
    target = build_trainer(
        config_for(
            tmp_path, digits_dir, "dst", [f"Global.pretrained_model={tmp_path}/weights"], use_ema=True
        ),
        DistEnv(),
    )
    for key, value in source.model.state_dict().items():
        assert torch.equal(target.model.state_dict()[key], value), key
        assert torch.equal(target.ema.module.state_dict()[key], value), key
    assert target.position.global_step == 0 and target.scheduler.last_step == 0  # weights only, no resume


def record_saves(trainer):
    """Makes ``trainer`` record (name, global_step, position) of every checkpoint it writes."""
    saves = []
    save = trainer.save

    def save_and_record(name, extra=None, **more):
        save(name, extra, **more)
        position = trainer.position
        saves.append(
            (name, position.global_step, position.next_epoch, position.next_batch, position.epoch_consumed)
        )

    trainer.save = save_and_record
    return saves


@pytest.mark.slow
def test_save_iter_step_writes_latest_mid_epoch(tmp_path, digits_dir):
    setup_logger(None)
    cfg = config_for(
        tmp_path,
        digits_dir,
        "iters",
        ["Global.epoch_num=1", "Global.eval_batch_epoch=null"],
        save_iter_step=10,
    )
    trainer = build_trainer(cfg, DistEnv())
    saves = record_saves(trainer)
    trainer.train()
    latest = [s for s in saves if s[0] == "latest"]
    # every 10 steps mid-epoch with the sample position, then the end of the 32-step epoch
    assert latest[:4] == [
        ("latest", 10, 1, 10, 160),
        ("latest", 20, 1, 20, 320),
        ("latest", 30, 1, 30, 480),
        ("latest", 32, 2, 0, 0),
    ]
    stored = torch.load(tmp_path / "iters" / "latest.pt", weights_only=True)["position"]
    assert (stored["dataset_len"], stored["batch_size_per_card"], stored["epoch_consumed"]) == (512, 16, 0)


@pytest.mark.slow
def test_resume_with_another_batch_layout_needs_auto_scale_lr_and_continues_the_epoch(tmp_path, digits_dir):
    from ppdist.errors import CheckpointError

    setup_logger(None)
    cfg = config_for(
        tmp_path, digits_dir, "first", ["Global.eval_batch_epoch=null", "Global.eval_batch_step=[0,12]", HALF]
    )
    first = build_trainer(cfg, DistEnv())
    snapshot = snapshot_first_best(first)
    first.train()  # snapshot at step 12: epoch 1, 12 x 16 = 192 samples used
    resume = [
        "Global.eval_batch_epoch=null",
        f"Global.checkpoints={snapshot}",
        "Train.loader.batch_size_per_card=8",
        HALF,
    ]
    with pytest.raises(CheckpointError, match=r"Global.auto_scale_lr: \{base_batch_size: N\}"):
        build_trainer(config_for(tmp_path, digits_dir, "refused", resume), DistEnv())

    scaled = config_for(
        tmp_path, digits_dir, "scaled", resume + ["Global.auto_scale_lr={base_batch_size: 16}"]
    )
    trainer = build_trainer(scaled, DistEnv())
    lr_factor = setup.lr_factor(scaled["Global"], trainer.sampler.samples_per_step)
    assert lr_factor == 0.5 and trainer.scheduler.schedule.base_lr == pytest.approx(0.001)
    # 256 - 192 = 64 samples left in epoch 1 = 8 batches of 8; the epoch has 32 such batches
    position = trainer.position
    assert (position.next_epoch, position.epoch_consumed, position.next_batch, position.global_step) == (
        1,
        192,
        24,
        24,
    )
    assert trainer.scheduler.last_step == 24
    trainer.train()
    assert trainer.position.global_step == 2 * 32


def test_auto_scale_lr_scales_every_learning_rate_of_the_schedule():
    from ppdist.optim import scale_learning_rates

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


@pytest.mark.slow
def test_compile_trains_like_eager_and_saves_plain_weights(tmp_path, digits_dir):
    """Global.compile wraps the training forward only: same losses and weights as eager, and
    checkpoints keep the model's own names. (aot_eager traces like inductor, minus code
    generation, which keeps the test fast; inductor is measured in docs/benchmarks.md.)"""
    setup_logger(None)
    common = ["Global.max_iters=4", "Global.eval_batch_epoch=null", "Global.eval_batch_step=[0,1000]"]
    eager = build_trainer(config_for(tmp_path, digits_dir, "eager", common), DistEnv())
    eager.train()
    compiled_cfg = config_for(
        tmp_path, digits_dir, "compiled", common + ["Global.compile={backend: aot_eager}"]
    )
    compiled = build_trainer(compiled_cfg, DistEnv())
    assert compiled.train_model is not compiled.model and hasattr(compiled.train_model, "_orig_mod")
    compiled.train()
    saved = torch.load(tmp_path / "compiled" / "latest.pt", weights_only=True)["model"]
    assert set(saved) == set(eager.model.state_dict())
    for name, tensor in eager.model.state_dict().items():
        torch.testing.assert_close(saved[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def test_training_metric_is_computed_on_log_steps_only(tmp_path, digits_dir):
    config = config_for(
        tmp_path, digits_dir, overrides=["Global.cal_metric_during_train=true", "Global.max_iters=20"]
    )
    trainer = build_trainer(config)
    postprocess, metric = trainer.train_metric
    calls = []

    def counting_postprocess(preds, batch):
        calls.append(trainer.position.global_step)
        return postprocess(preds, batch)

    trainer.train_metric = (counting_postprocess, metric)
    with ppdist_log_records() as records:
        trainer.train()
    # the training lines (the final evaluation's cur metric line names its global_step too)
    lines = [r.getMessage() for r in records if r.getMessage().startswith("epoch: ")]
    assert calls == [5, 10, 15, 20] and len(lines) == 4, (calls, lines)
    assert all("acc: " in line and "norm_edit_dis: " in line for line in lines)


def test_a_training_batch_without_usable_sample_stops_with_the_bad_sample_summary(tmp_path, digits_dir):
    labels = tmp_path / "all_missing.txt"
    labels.write_text("".join(f"absent_{i}.jpg\t{i}{i}{i}\n" for i in range(64)), encoding="utf-8")
    config = config_for(tmp_path, digits_dir, overrides=[f"Train.dataset.label_file_list=[{labels}]"])
    trainer = build_trainer(config)
    with pytest.raises(DataError, match="no usable sample.*absent_"):
        trainer.train()


def test_resuming_a_checkpoint_of_another_architecture_says_so_first(tmp_path, digits_dir):
    first = build_trainer(config_for(tmp_path, digits_dir, save="a"))
    state = first.state_dict()
    other = build_trainer(
        config_for(tmp_path, digits_dir, save="b", overrides=["Architecture.Neck.hidden_size=32"])
    )
    with pytest.raises(
        CheckpointError, match="does not fit Architecture: .*shape mismatch.*Global.pretrained_model"
    ):
        other.load_state_dict(dict(state), source="a/latest.pt")
    foreign = dict(
        state, model={"backbone.stem.weight": torch.zeros(1)}, position=dict(state["position"], dataset_len=7)
    )
    with pytest.raises(CheckpointError, match="does not fit Architecture: .* missing .* unexpected"):
        other.load_state_dict(foreign, source="det/latest.pt")  # not blamed on the data set's length


def test_pretrained_weights_of_which_nothing_fits_are_refused(tmp_path, digits_dir):
    path = tmp_path / "foreign.pt"
    torch.save({"head.conv.weight": torch.zeros(3, 3)}, path)
    config = config_for(tmp_path, digits_dir, overrides=[f"Global.pretrained_model={path}"])
    with pytest.raises(ConfigError, match="none of its tensors fits Architecture"):
        build_trainer(config)
