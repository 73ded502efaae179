"""The documented Python API (ppdist/__init__.py, README): a config's parts run by the loop."""

from __future__ import annotations

import torch
from ppdist_testing import tiny_run_config

import ppdist
from ppdist.engine.logger import setup_logger


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
    trainer = ppdist.build_trainer(tiny_run_config(tmp_path, digits_dir, "env", ["Global.use_gpu=false"]))
    assert trainer.env.world_size == 1 and trainer.env.device.type == "cpu"
    assert [hook.hook_name for hook in trainer.hooks] == [
        "bad_samples",
        "log",
        "curves",
        "nonfinite",
        "evaluation",
        "checkpoint",
    ]
