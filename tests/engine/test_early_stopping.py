"""Global.early_stop: the run ends when the main indicator stops improving, and stays ended on resume."""

import pytest
import torch
from ppdist_testing import tiny_run_config

from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer
from ppdist.errors import ConfigError

EVERY_2 = ["Global.max_iters=40", "Global.eval_batch_epoch=null", "Global.eval_batch_step=[0,2]"]


@pytest.mark.slow
def test_stops_after_patience_evaluations_without_improvement_and_resumes_stopped(tmp_path, digits_dir):
    setup_logger(None)
    stop = "Global.early_stop={patience: 2, min_delta: 1.0}"  # acc cannot rise by more than 1
    trainer = build_trainer(tiny_run_config(tmp_path, digits_dir, "run", EVERY_2 + [stop]), DistEnv())
    summary = trainer.train()
    # evaluations at 2 (the first best), 4 and 6 (no improvement > 1.0): stop after step 6
    assert trainer.position.global_step == 6 and summary["early_stopped"] is True
    assert trainer.hook("evaluation").last_eval_step == 6  # not evaluated again at the end
    assert trainer.stop_reason.startswith("early stop: acc has not improved by more than 1")
    saved = torch.load(tmp_path / "run" / "latest.pt", weights_only=True)
    assert saved["position"]["global_step"] == 6
    assert (
        saved["hooks"]["early_stop"]["stopped"] is True
        and saved["hooks"]["early_stop"]["bad_evaluations"] == 2
    )

    resumed = build_trainer(
        tiny_run_config(tmp_path, digits_dir, "run", EVERY_2 + [stop, "Global.checkpoints=auto"]), DistEnv()
    )
    resumed.train()
    assert resumed.position.global_step == 6  # a stopped run does not train on, and says how to
    assert resumed.stop_reason.endswith(
        "before this resume; raise Global.early_stop.patience above 2 to train on"
    )

    more_patience = stop.replace("patience: 2", "patience: 4")
    resumed = build_trainer(
        tiny_run_config(tmp_path, digits_dir, "run", EVERY_2 + [more_patience, "Global.checkpoints=auto"]),
        DistEnv(),
    )
    summary = resumed.train()  # trains on with the new patience: evaluations 8 and 10 without improvement
    assert resumed.position.global_step == 10 and summary["early_stopped"] is True


def test_improving_runs_are_not_stopped(tmp_path, digits_dir):
    setup_logger(None)
    config = tiny_run_config(
        tmp_path, digits_dir, "run", EVERY_2[1:] + ["Global.max_iters=8", "Global.early_stop={patience: 3}"]
    )
    trainer = build_trainer(config, DistEnv())
    trainer.train()  # 4 evaluations, at most 3 in a row without a rise of acc: patience 3 is never reached
    early_stop = trainer.hook("early_stop")
    assert trainer.position.global_step == 8 and not early_stop.stopped
    assert early_stop.best == trainer.hook("evaluation").best["acc"]  # min_delta 0: the best so far


@pytest.mark.parametrize(
    "setting,message",
    [
        ("{patience: 0}", "Global.early_stop.patience must be a positive integer"),
        ("{patience: 2, min_delta: -1}", "Global.early_stop.min_delta must be a finite number >= 0"),
        (
            "{patience: 2, min_delta: .nan}",
            r"Global.early_stop.min_delta must be a finite number >= 0, got nan",
        ),
        ("{patience: 2, min_delt: 0.1}", "unknown key Global.early_stop.min_delt"),
    ],
)
def test_bad_settings_are_refused_by_name(tmp_path, digits_dir, setting, message):
    with pytest.raises(ConfigError, match=message):
        tiny_run_config(tmp_path, digits_dir, "run", [f"Global.early_stop={setting}"])


def test_config_keys_validate(tmp_path, digits_dir):
    for key in ("accumulate_steps", "keep_checkpoint_max"):
        with pytest.raises(ConfigError, match=f"Global.{key} must be a positive integer"):
            tiny_run_config(tmp_path, digits_dir, "run", [f"Global.{key}=0"])
    with pytest.raises(ConfigError, match=r"Global.nan_policy must be one of \['stop', 'skip'\]"):
        tiny_run_config(tmp_path, digits_dir, "run", ["Global.nan_policy=ignore"])
