"""Global.profiler_options: torch.profiler on exactly the window of steps, a Chrome trace and the
operator table written, and the run ended after the window when PaddleOCR's exit_on_finished asks."""

from __future__ import annotations

import json
import os
import re
from unittest.mock import patch

import pytest
from ppdist_testing import tiny_run_config
from torch.profiler import ProfilerAction

from ppdist.engine.dist import DistEnv
from ppdist.engine.hooks import TorchProfiler
from ppdist.engine.hooks import profiler as profiler_module
from ppdist.engine.hooks.profiler import window_schedule
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer
from ppdist.errors import ConfigError


def profiled_steps(trace_path: str) -> list:
    with open(trace_path, encoding="utf-8") as handle:
        trace = json.load(handle)
    names = {event.get("name", "") for event in trace["traceEvents"]}
    return sorted(int(m.group(1)) for m in map(re.compile(r"ProfilerStep#(\d+)$").match, names) if m)


@pytest.mark.slow
def test_the_window_is_traced_and_the_run_ends_with_it(tmp_path, digits_dir):
    setup_logger(None)
    folder = tmp_path / "prof"
    options = (
        f"batch_range=[3,5];state=GPU;tracer_option=OpDetail;profile_path={folder};exit_on_finished=true"
    )
    config = tiny_run_config(tmp_path, digits_dir, "p", [f"Global.profiler_options='{options}'"])
    trainer = build_trainer(config, DistEnv())
    trainer.train()
    assert trainer.position.global_step == 5 and "exit_on_finished" in trainer.stop_reason
    (trace,) = trainer.hook("profiler").trace_files
    assert os.path.dirname(trace) == str(folder) and re.fullmatch(
        r"rank0\.\d+\.pt\.trace\.json", os.path.basename(trace)
    )
    assert profiled_steps(trace) == [3, 4]  # steps 3 and 4 (0-based): those that end at global_step 4 and 5
    table = (folder / "rank0.key_averages.txt").read_text()
    assert "aten::" in table and "Input Shapes" in table  # OpDetail groups by input shape


def test_without_exit_the_run_goes_on_after_the_window(tmp_path, digits_dir):
    setup_logger(None)
    options = "batch_range=[0,1];exit_on_finished=false"
    config = tiny_run_config(
        tmp_path, digits_dir, "q", ["Global.max_iters=3", f"Global.profiler_options='{options}'"]
    )
    trainer = build_trainer(config, DistEnv())
    trainer.train()
    assert trainer.position.global_step == 3 and trainer.stop_reason is None
    (trace,) = trainer.hook("profiler").trace_files
    assert os.path.dirname(trace) == os.path.join(config["Global"]["save_model_dir"], "profiler")
    assert profiled_steps(trace) == [0]


def test_the_schedule_warms_up_on_the_step_before_the_window():
    action = window_schedule(3, 6)
    assert [action(step) for step in range(8)] == [ProfilerAction.NONE] * 2 + [
        ProfilerAction.WARMUP,
        ProfilerAction.RECORD,
        ProfilerAction.RECORD,
        ProfilerAction.RECORD_AND_SAVE,
        ProfilerAction.NONE,
        ProfilerAction.NONE,
    ]


def test_timer_only_writes_no_trace(tmp_path, digits_dir):
    setup_logger(None)
    options = f"batch_range=[1,2];timer_only=true;profile_path={tmp_path / 'none'}"
    config = tiny_run_config(tmp_path, digits_dir, "t", [f"Global.profiler_options='{options}'"])
    trainer = build_trainer(config, DistEnv())
    trainer.train()
    hook = trainer.hook("profiler")
    assert isinstance(hook, TorchProfiler) and trainer.position.global_step == 2
    assert hook.trace_files == [] and hook.window_steps == 1 and not (tmp_path / "none").exists()


def test_a_rank_the_run_does_not_have_is_refused_before_the_first_step(tmp_path, digits_dir):
    config = tiny_run_config(
        tmp_path, digits_dir, "r", ["Global.profiler_options='batch_range=[1,2];ranks=1'"]
    )
    trainer = build_trainer(config, DistEnv())
    with pytest.raises(ConfigError, match=r"ranks=1, but the run has 1 process\(es\)"):
        trainer.train()
    assert trainer.position.global_step == 0


def test_an_unwritable_profile_path_is_refused_before_the_first_step(tmp_path, digits_dir):
    (tmp_path / "a_file").write_text("")
    folder = tmp_path / "a_file" / "prof"
    config = tiny_run_config(
        tmp_path, digits_dir, "w", [f"Global.profiler_options='batch_range=[3,5];profile_path={folder}'"]
    )
    trainer = build_trainer(config, DistEnv())
    with pytest.raises(
        ConfigError, match=f"the profile_path {folder} cannot be written .*writable profile_path"
    ):
        trainer.train()
    assert trainer.position.global_step == 0


@pytest.mark.parametrize(
    "window, message",
    [
        ("[5,8]", "batch_range=[5, 8) starts after this run's last step (index 2 of 3 steps): nothing will"),
        ("[1,8]", "batch_range=[1, 8) ends after this run's 3 steps: only steps [1, 3) will be profiled"),
    ],
)
def test_a_window_past_the_end_of_the_run_is_warned_about_at_the_start(tmp_path, digits_dir, window, message):
    setup_logger(None)
    options = f"batch_range={window};timer_only=true"
    config = tiny_run_config(
        tmp_path, digits_dir, "e", ["Global.max_iters=3", f"Global.profiler_options='{options}'"]
    )
    trainer = build_trainer(config, DistEnv())
    hook = trainer.hook("profiler")
    with patch.object(profiler_module.logger, "warning") as warn:
        hook.before_train()
    (line,) = [call.args[0] % call.args[1:] for call in warn.call_args_list]
    assert message in line
