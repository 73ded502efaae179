"""The command-line tools fail cleanly: one message, an exit code, no traceback."""

import os

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
    assert result.returncode == 1
    assert f"Eval.dataset.label_file_list: label file not found: {missing}" in result.stderr
    assert "Traceback" not in result.stderr


def test_eval_without_weights_is_a_config_error(tmp_path, digits_dir):
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "o"))
    result = run_tool(["eval.py", "-c", cfg])
    assert result.returncode == 2 and "Global.checkpoints" in result.stderr
