"""The documented Python API (ppdist/__init__.py, README): a config's parts run by the loop."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from ppdist_testing import tiny_run_config

import ppdist
from ppdist.engine.logger import LOGGER_NAME, setup_logger
from ppdist.errors import ConfigError


def test_the_api_names_are_there():
    for name in ppdist.__all__:
        assert getattr(ppdist, name) is not None, name


def test_the_parts_of_a_config_train_in_the_loop_without_the_tools(tmp_path, digits_dir):
    setup_logger(None)
    config = tiny_run_config(tmp_path, digits_dir, "api")
    model = ppdist.build_model(config)
    loader = ppdist.build_dataloader(config, "Train", "train")
    optimizer, scheduler = ppdist.build_optimizer(config, model, steps_per_epoch=len(loader))
    assert len(loader) == 32 and scheduler.schedule.base_lr == 0.002
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = ppdist.Trainer(model, ppdist.build_loss(config), optimizer, scheduler, loader, total_steps=6)
    assert trainer.train() == {}  # no hook with a summary
    assert trainer.position.global_step == 6 and scheduler.last_step == 6
    assert not torch.equal(model.state_dict()["head.fc.weight"], before["head.fc.weight"])
    assert trainer.last_step.values["loss"].ndim == 0


def test_build_trainer_takes_the_process_from_the_environment(tmp_path, digits_dir):
    setup_logger(None)
    trainer = ppdist.build_trainer(
        tiny_run_config(tmp_path, digits_dir, "env", ["Global.use_gpu=false", "Global.plot_curves=true"])
    )
    assert trainer.env.world_size == 1 and trainer.env.device.type == "cpu"
    assert [hook.hook_name for hook in trainer.hooks] == [
        "run_dir",
        "bad_samples",
        "log",
        "curves",
        "nonfinite",
        "evaluation",
        "checkpoint",
    ]


@pytest.mark.slow
def test_the_api_refuses_to_overwrite_a_run_and_logs_like_the_cli(tmp_path, digits_dir):
    """``build_trainer(...).train()`` claims save_model_dir as tools/train.py does: a second run
    into a folder holding the first one's checkpoints is refused (unless it resumes or overwrites),
    and without a configured logger the run logs to the console and train.log."""
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):  # a user's fresh interpreter: no handler
        logger.removeHandler(handler)
    overrides = ["Global.epoch_num=1", "Global.use_gpu=false"]
    config = tiny_run_config(tmp_path, digits_dir, "run", overrides)
    ppdist.build_trainer(config).train()
    save_dir = config["Global"]["save_model_dir"]
    latest = os.path.join(save_dir, "latest.pt")
    written = os.path.getmtime(latest)
    with open(os.path.join(save_dir, "train.log"), encoding="utf-8") as handle:
        assert "global_step: 5" in handle.read()
    with pytest.raises(ConfigError, match="already holds a run's checkpoints"):
        ppdist.build_trainer(tiny_run_config(tmp_path, digits_dir, "run", overrides))
    assert os.path.getmtime(latest) == written
    assert not os.path.exists(os.path.join(save_dir, ".ppdist.lock"))  # the first run gave it back
    resumed = tiny_run_config(tmp_path, digits_dir, "run", overrides + ["Global.checkpoints=auto"])
    assert ppdist.build_trainer(resumed).position.global_step > 0  # resuming is allowed


class Fails(ppdist.Hook):
    def after_step(self):
        raise RuntimeError("stopped by the test")


def test_a_failed_api_run_gives_its_folder_back(tmp_path, digits_dir):
    """Training that stops on an exception releases save_model_dir (the process lives on: a
    notebook), so that another process may use the folder."""
    setup_logger(None)
    config = tiny_run_config(tmp_path, digits_dir, "failed", ["Global.use_gpu=false"])
    trainer = ppdist.build_trainer(config, hooks=[Fails()])
    lock = os.path.join(config["Global"]["save_model_dir"], ".ppdist.lock")
    assert os.path.exists(lock)
    with pytest.raises(RuntimeError, match="stopped by the test"):
        trainer.train()
    assert not os.path.exists(lock)
