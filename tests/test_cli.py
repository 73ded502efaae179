"""Clean error messages from the tools, also for errors raised inside DataLoader workers."""

import logging
import subprocess
import sys

import pytest
from ppdist_testing import REPO, check_ok, child_env, run_tool
from torch.utils.data import DataLoader

from ppdist import cli
from ppdist.cli import error_message
from ppdist.engine.dist import DistEnv, warn_cpu_fallback
from ppdist.engine.logger import setup_logger
from ppdist.errors import CheckpointError, ConfigError, DataError, shared


def _failing_collate(samples):
    raise DataError("samples of one batch have different sizes: use batch_size_per_card: 1")


def test_worker_error_keeps_only_the_original_message():
    try:
        list(DataLoader([1, 2], batch_size=2, collate_fn=_failing_collate, num_workers=1))
    except DataError as exc:
        assert "Traceback" in str(exc)  # what torch re-raises
        assert error_message(exc) == "samples of one batch have different sizes: use batch_size_per_card: 1"
    else:  # pragma: no cover
        raise AssertionError("the loader did not fail")


def test_plain_errors_are_unchanged():
    assert error_message(DataError("missing file x.png")) == "missing file x.png"


@pytest.mark.slow
def test_infer_refuses_a_batch_size_below_one_and_tools_explain_their_options(tmp_path):
    refused = run_tool(["infer.py", "--input", str(tmp_path), "--batch_size", "-5"])
    assert refused.returncode == 2
    assert "--batch_size: expected a positive integer, got -5" in refused.stderr
    assert "Traceback" not in refused.stderr
    infer_help = check_ok(run_tool(["infer.py", "-h"])).stdout
    assert "images per forward pass" in " ".join(infer_help.split())
    export_help = check_ok(run_tool(["export_model.py", "-h"])).stdout
    assert "model.onnx, model.pt (TorchScript) or both" in " ".join(export_help.split())


def _exit_of(error, capsys, monkeypatch, rank: int):
    """Run ``run_main`` on a function raising ``error`` as process ``rank``: (exit code, stdout, stderr)."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setattr(cli.time, "sleep", lambda seconds: None)

    def fail():
        raise error

    with pytest.raises(SystemExit) as info:
        cli.run_main(fail)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def test_an_error_is_printed_once_on_rank_0_and_in_train_log(tmp_path, capsys, monkeypatch):
    log = tmp_path / "train.log"
    setup_logger(str(log), rank=0)
    try:
        code, out, err = _exit_of(shared(CheckpointError("latest.pt is broken")), capsys, monkeypatch, 0)
    finally:
        logging.getLogger("ppdist").handlers.clear()
    assert code == 1 and err == "ppdist: error: latest.pt is broken\n" and out == ""
    assert log.read_text().count("ERROR: latest.pt is broken") == 1


def test_other_ranks_say_they_stopped_for_an_error_every_rank_raised(capsys, monkeypatch):
    code, out, err = _exit_of(shared(CheckpointError("latest.pt is broken")), capsys, monkeypatch, 1)
    assert (code, out, err) == (1, "", "ppdist: rank 1 stopped: rank 0 reports the error\n")
    code, _, err = _exit_of(ConfigError("Global.x: unknown key"), capsys, monkeypatch, 3)
    assert (code, err) == (2, "ppdist: rank 3 stopped: rank 0 reports the error\n")
    code, _, err = _exit_of(DataError("img.png unreadable"), capsys, monkeypatch, 2)  # this rank's own
    assert (code, err) == (1, "ppdist: rank 2: error: img.png unreadable\n")


def test_cpu_fallback_is_logged_through_the_logger_with_what_runs(tmp_path, capsys):
    log = tmp_path / "eval.log"
    setup_logger(str(log), rank=0)
    try:
        warn_cpu_fallback(DistEnv(cpu_fallback=True), "evaluating")
        warn_cpu_fallback(DistEnv(rank=1, cpu_fallback=True), "evaluating")
        warn_cpu_fallback(DistEnv(), "evaluating")
    finally:
        logging.getLogger("ppdist").handlers.clear()
    line = "ppdist WARNING: Global.use_gpu is true but CUDA is not available: evaluating on CPU"
    assert log.read_text().count(line) == 1 and capsys.readouterr().out.count(line) == 1


def test_tools_help_does_not_load_torchvision_or_dynamo():
    """Every tool imports ppdist before parsing; torchvision.ops at import time loaded torch._dynamo
    (about 3 s of the ~10 s that -h took)."""
    code = (
        "import sys, ppdist; print(sorted(m for m in ('torchvision', 'torch._dynamo') if m in sys.modules))"
    )
    result = check_ok(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env())
    )
    assert result.stdout.strip() == "[]"
    # nor do the tools' own modules (infer.py and export_model.py reach the export code)
    tools = "import sys; sys.path.insert(0, 'tools'); " + "; ".join(
        f"import {name}" for name in ("train", "eval", "infer", "export_model", "benchmark")
    )
    result = check_ok(
        subprocess.run(
            [sys.executable, "-c", tools + "; " + code.split("; ", 1)[1]],
            capture_output=True,
            text=True,
            env=child_env(),
            cwd=REPO,
        )
    )
    assert result.stdout.strip() == "[]"
