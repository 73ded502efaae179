"""Training curves: train.log and TensorBoard read back alike, tools/plot_logs.py, and curves.png
after every evaluation of a run (a resumed run included)."""

import os
import shutil

import pytest
from picture_testing import assert_picture
from ppdist_testing import check_ok, run_tool, tiny_run_config

from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer
from ppdist.visualize import draw_curves, parse_train_log, read_run, read_tensorboard

COMMON = ["Global.use_tensorboard=true", "Global.print_batch_step=2", "Global.eval_batch_epoch=null"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, digits_dir):
    """Two short runs of 8 steps with evaluations at 4 and 8, logged to train.log and TensorBoard."""
    root = tmp_path_factory.mktemp("curves")
    out = {}
    for name, lr in (("slow", 0.001), ("fast", 0.004)):
        overrides = COMMON + [
            "Global.max_iters=8",
            "Global.eval_batch_step=[0,4]",
            f"Optimizer.lr.learning_rate={lr}",
        ]
        config = tiny_run_config(root, digits_dir, name, overrides)
        setup_logger(os.path.join(config["Global"]["save_model_dir"], "train.log"))
        build_trainer(config, DistEnv()).train()
        out[name] = config["Global"]["save_model_dir"]
    setup_logger(None)
    return out


def test_the_log_gives_what_tensorboard_got(runs):
    for run_dir in runs.values():
        from_log = parse_train_log(os.path.join(run_dir, "train.log"))
        from_board = read_tensorboard(os.path.join(run_dir, "tensorboard"))
        assert (
            set(from_log) == set(from_board) >= {"train/loss", "train/lr", "eval/acc", "eval/norm_edit_dis"}
        )
        assert sorted(from_log["train/loss"]) == [2, 4, 6, 8] and sorted(from_log["eval/acc"]) == [4, 8]
        for name, points in from_board.items():  # the log prints 6 decimals
            assert from_log[name].keys() == points.keys(), name
            for step, value in points.items():
                assert from_log[name][step] == pytest.approx(value, abs=6e-6, rel=1e-6), (name, step)


def test_plot_logs_overlays_runs_and_names_unknown_keys(runs, tmp_path):
    out = str(tmp_path / "both.png")
    result = check_ok(
        run_tool(["plot_logs.py", runs["slow"], runs["fast"], "--keys", "loss,lr,acc", "--out", out])
    )
    assert "wrote" in result.stdout and "loss, lr, acc of 2 run(s)" in result.stdout
    assert_picture(out, (1500, 320))
    board = str(tmp_path / "board.png")  # the same from the TensorBoard events (in-process)
    assert draw_curves({"slow": read_run(runs["slow"], "tensorboard")}, board) == draw_curves(
        {"slow": read_run(runs["slow"], "log")}, out
    )
    assert_picture(board, (1500, 640))
    bad = run_tool(["plot_logs.py", runs["slow"], "--keys", "loss,mAP", "--out", out])
    assert bad.returncode == 2 and "no curve named mAP in these runs; they logged: loss, lr" in bad.stderr


def test_draw_curves_plots_the_values_given(tmp_path):
    series = {
        "train/loss": {1: 4.0, 2: 2.0, 3: 1.0},
        "train/lr": {1: 0.1, 2: 0.1, 3: 0.05},
        "eval/acc": {3: 0.5},
    }
    path = str(tmp_path / "c.png")
    assert draw_curves({"a": series}, path) == ["loss", "lr", "acc"]
    assert draw_curves({"a": series}, path, ["eval/acc"]) == ["eval/acc"]
    with pytest.raises(ValueError, match="nothing to plot"):
        draw_curves({"a": {}}, path)


def test_curves_png_follows_the_evaluations_and_a_resume(runs, tmp_path, digits_dir):
    curves = os.path.join(runs["slow"], "curves.png")
    assert_picture(curves, (1500, 640))  # loss, lr, acc, norm_edit_dis
    # resume the slow run from its step-4 state in a new folder: its history starts from the old log
    overrides = COMMON + ["Global.max_iters=12", "Global.eval_batch_step=[0,4]", "Global.checkpoints=auto"]
    config = tiny_run_config(tmp_path, digits_dir, "again", overrides)
    again = config["Global"]["save_model_dir"]
    os.makedirs(again)
    with open(os.path.join(runs["slow"], "train.log"), encoding="utf-8") as handle:
        lines = handle.read()
    with open(os.path.join(again, "train.log"), "w", encoding="utf-8") as handle:
        handle.write(lines)  # the log as the interrupted run left it, to step 8
    shutil.copy(os.path.join(runs["slow"], "latest.pt"), os.path.join(again, "latest.pt"))
    setup_logger(os.path.join(again, "train.log"))
    trainer = build_trainer(config, DistEnv())
    attached = []
    add_sink = trainer.writer.add_sink
    trainer.writer.add_sink = lambda sink: (attached.append(sink), add_sink(sink))[-1]
    trainer.train()
    setup_logger(None)
    (sink,) = [s for s in attached if s.label == "curves"]
    assert sorted(sink.series["train/loss"]) == [2, 4, 6, 8, 10, 12]  # steps 2-8 from the earlier log
    assert sorted(sink.series["eval/acc"]) == [4, 8, 12]
    assert (
        sink.series["eval/acc"][4] == parse_train_log(os.path.join(runs["slow"], "train.log"))["eval/acc"][4]
    )
    assert_picture(os.path.join(again, "curves.png"), (1500, 640))


def test_read_run_names_the_missing_tensorboard_folder_not_the_log(tmp_path):
    """--source tensorboard on a run trained without TensorBoard: the message names what is missing
    (issue 28: it said "has no train.log" beside one) and how to draw the log instead."""
    (tmp_path / "train.log").write_text("")
    with pytest.raises(FileNotFoundError) as info:
        read_run(str(tmp_path), "tensorboard")
    message = str(info.value)
    assert "has no train.log" not in message
    assert f"{tmp_path} has no tensorboard folder" in message
    assert "Global.use_tensorboard" in message and "without --source tensorboard" in message
    with pytest.raises(FileNotFoundError, match="has no train.log and no tensorboard folder"):
        read_run(str(tmp_path / "empty"), "auto")
