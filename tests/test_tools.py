"""The command-line tools fail cleanly: one message, an exit code, no traceback."""

import os

import pytest
from ppdist_testing import run_tool, tiny_config


def test_config_typo_exits_2_with_one_paragraph(tmp_path, digits_dir):
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "o"))
    result = run_tool(["train.py", "-c", cfg, "-o", "Optimizer.lr.name=Cosin"])
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"ppdist: config error: {cfg}: unknown lr schedule name 'Cosin' at "
        f"Optimizer.lr. Did you mean: 'Cosine', 'CosineDecay', 'Const'?"
    )
    assert not os.path.exists(tmp_path / "o")  # validation happens before anything runs


def test_missing_label_file_names_path_and_key(tmp_path, digits_dir):
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "o"))
    missing = str(tmp_path / "absent.txt")
    result = run_tool(["train.py", "-c", cfg, "-o", f"Eval.dataset.label_file_list=[{missing}]"])
    assert_one_input_error(result, f"Eval.dataset.label_file_list: label file not found: {missing}")


def assert_one_input_error(result, message: str) -> None:
    """An input mistake: exit 2 and ``message`` printed once (stderr), not also by the console log."""
    assert result.returncode == 2, result.stderr
    assert f"ppdist: error: {message}" in result.stderr
    assert (result.stdout + result.stderr).count(message) == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_missing_dataset_dir_is_an_input_error(tmp_path, digits_dir):
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "o"))
    missing = str(tmp_path / "absent")
    result = run_tool(["train.py", "-c", cfg, "-o", f"Train.dataset.data_dir={missing}"])
    assert_one_input_error(result, f"Train.dataset.data_dir: directory not found: {missing}")


def test_missing_checkpoint_is_an_input_error(tmp_path, digits_dir):
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "o"))
    missing = str(tmp_path / "absent.pt")
    result = run_tool(["eval.py", "-c", cfg, "-o", f"Global.checkpoints={missing}"])
    assert_one_input_error(result, f"checkpoint not found: {missing}")
    assert "evaluating on CPU" in result.stdout or "use_gpu" not in result.stdout + result.stderr


def test_eval_without_weights_is_a_config_error(tmp_path, digits_dir):
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "o"))
    result = run_tool(["eval.py", "-c", cfg])
    assert result.returncode == 2 and "Global.checkpoints" in result.stderr


@pytest.mark.slow
def test_an_error_every_rank_meets_is_printed_once_under_torchrun(tmp_path, digits_dir):
    """2 processes used to print a missing checkpoint 4 times (each rank: console log + stderr)."""
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "o"))
    missing = str(tmp_path / "absent.pt")
    result = run_tool(["eval.py", "-c", cfg, "-o", f"Global.checkpoints={missing}"], nproc=2)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and output.count(f"checkpoint not found: {missing}") == 1, output
    assert "ppdist: rank 1 stopped: rank 0 reports the error" in result.stderr
    assert 'eval.py", line' not in output  # (torchrun's own summary has a traceback of torchrun)
