"""Training curves: train.log and TensorBoard read back alike, tools/plot_logs.py, and curves.png
after every evaluation of a run (a resumed run included)."""

import os
import shutil
import types

import pytest
from picture_testing import assert_picture, keep_saved_figures
from ppdist_testing import check_ok, run_tool, tiny_run_config

from ppdist.engine.dist import DistEnv
from ppdist.engine.hooks.curves import TrainingCurves
from ppdist.engine.logger import format_eval_line, format_metrics, format_train_line, setup_logger
from ppdist.engine.setup import build_trainer
from ppdist.visualize import curves as curves_module
from ppdist.visualize import draw_curves, parse_train_log, read_run, read_tensorboard
from ppdist.visualize.curves import layout

COMMON = ["Global.use_tensorboard=true", "Global.print_batch_step=2", "Global.eval_batch_epoch=null"]
COMMON += ["Global.plot_curves=true"]  # tiny_run_config draws no curves


def train(config):
    """Train in-process with the run's train.log; returns the trainer."""
    setup_logger(os.path.join(config["Global"]["save_model_dir"], "train.log"))
    try:
        trainer = build_trainer(config, DistEnv())
        trainer.train()
    finally:
        setup_logger(None)
    return trainer


def curves_hook(trainer) -> TrainingCurves:
    (hook,) = [h for h in trainer.hooks if h.hook_name == "curves"]
    return hook


@pytest.fixture(scope="module")
def runs(tmp_path_factory, digits_dir):
    """Two short runs of 8 steps with evaluations at 4 and 8, logged to train.log and TensorBoard
    (``slow`` keeps a snapshot at step 4); ``hooks`` holds their curves hooks."""
    root = tmp_path_factory.mktemp("curves")
    out = {"hooks": {}}
    for name, lr in (("slow", 0.001), ("fast", 0.004)):
        overrides = COMMON + [
            "Global.max_iters=8",
            "Global.eval_batch_step=[0,4]",
            "Global.save_iter_step=4",
            f"Optimizer.lr.learning_rate={lr}",
        ]
        config = tiny_run_config(root, digits_dir, name, overrides)
        out["hooks"][name] = curves_hook(train(config))
        out[name] = config["Global"]["save_model_dir"]
    return out


@pytest.mark.slow
def test_the_log_gives_what_tensorboard_and_the_hook_got(runs):
    for name in ("slow", "fast"):
        run_dir = runs[name]
        from_log = parse_train_log(os.path.join(run_dir, "train.log"))
        from_board = read_tensorboard(os.path.join(run_dir, "tensorboard"))
        in_memory = runs["hooks"][name].sink.series
        assert (
            set(from_log)
            == set(from_board)
            == set(in_memory)
            >= {"train/loss", "train/lr", "eval/acc", "eval/norm_edit_dis"}
        )
        assert sorted(from_log["train/loss"]) == [2, 4, 6, 8] and sorted(from_log["eval/acc"]) == [4, 8]
        for name, points in from_board.items():  # the log prints 6 decimals
            assert from_log[name].keys() == points.keys() == in_memory[name].keys(), name
            for step, value in points.items():
                assert from_log[name][step] == pytest.approx(value, abs=6e-6, rel=1e-6), (name, step)
                assert in_memory[name][step] == pytest.approx(value, rel=1e-6), (name, step)


@pytest.mark.slow
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
    # PP-YOLOE's 5 loss terms + lr + 12 COCO numbers: 4 columns of smaller panels, within 1600 x 1200
    assert layout(18) == (4, 5, (400, 240)) and layout(4) == (3, 2, (500, 320))


@pytest.fixture
def drawn_figures(monkeypatch):
    """The figures draw_curves saves, kept for inspection (and still written)."""
    return keep_saved_figures(monkeypatch, curves_module)


COCO_NAMES = ("ap", "ap50", "ap75", "ap_small", "ap_medium", "ap_large", "ar1", "ar10", "ar100")
COCO_NAMES += ("ar_small", "ar_medium", "ar_large")


def _det_series():
    """A PP-YOLOE run's values: 5 loss terms, lr, the 12 COCO numbers (-1: no object of that
    size), the image count."""
    series = {f"train/{n}": {4: 3.0, 8: 2.0} for n in ("loss", "loss_cls", "loss_iou", "loss_dfl", "loss_l1")}
    series["train/lr"] = {4: 0.01, 8: 0.01}
    for name in COCO_NAMES:
        series[f"eval/{name}"] = {4: 0.1, 8: 0.2}
    series["eval/ap_small"] = {4: -1.0, 8: -1.0}
    series["eval/ap_medium"] = {4: -1.0, 8: 0.3}
    series["eval/images"] = {4: 12.0, 8: 12.0}
    return series


def test_curves_draw_losses_lr_and_the_main_metrics(tmp_path, drawn_figures):
    """Detection: the loss terms, the learning rate, AP, AP50 and AP75; not the size breakdowns,
    the recalls or the image count (``--keys`` still draws a breakdown, without COCO's -1)."""
    path = str(tmp_path / "det.png")
    names = ["loss", "lr", "loss_cls", "loss_iou", "loss_dfl", "loss_l1", "ap", "ap50", "ap75"]
    assert draw_curves({"det": _det_series()}, path) == names
    assert [axes.get_title() for axes in drawn_figures[0].axes] == names
    assert_picture(path, (1500, 960))
    assert draw_curves({"det": _det_series()}, path, ["ap_medium", "ap_small"]) == ["ap_medium"]
    (line,) = drawn_figures[1].axes[0].get_lines()
    assert list(line.get_xdata()) == [8] and list(line.get_ydata()) == [0.3]  # -1 is "no data"
    seg = {"train/loss": {2: 1.0}, "train/lr": {2: 0.01}, "eval/miou": {2: 0.5}, "eval/images": {2: 6.0}}
    assert draw_curves({"seg": seg}, path) == ["loss", "lr", "miou"]
    seg["eval/miou"] = {2: float("nan"), 4: 0.25}  # nan: nothing was evaluated at step 2
    seg["eval/kappa"] = {2: float("nan")}
    assert draw_curves({"seg": seg}, path) == ["loss", "lr", "miou"]
    (line,) = drawn_figures[3].axes[2].get_lines()
    assert list(line.get_xdata()) == [4] and list(line.get_ydata()) == [0.25]


def test_curves_have_no_offset_or_scientific_axis(tmp_path, drawn_figures):
    """A metric near zero reads as itself (0.00000030), not as 3 under a 1e-7 multiplier."""
    series = {"eval/norm_edit_dis": {2: 0.0, 4: 3e-7, 6: 2e-8}, "train/lr": {2: 1.0001, 4: 1.0002}}
    draw_curves({"a": series}, str(tmp_path / "c.png"))
    for axes in drawn_figures[0].axes:
        for axis in (axes.xaxis, axes.yaxis):
            assert axis.get_major_formatter().get_offset() == "", axes.get_title()
            labels = [t.get_text() for t in axis.get_ticklabels()]
            assert not any("e-" in label or "10^" in label for label in labels), labels
    labels = [t.get_text() for t in drawn_figures[0].axes[1].yaxis.get_ticklabels()]
    assert pytest.approx(3e-7, abs=1e-12) in [float(label.replace("\u2212", "-")) for label in labels]


def _train_line(step: int, loss: float, lr: float = 0.001) -> str:
    line = format_train_line(1, 3, step, lr, {"loss": loss, "acc": 0.5}, 0.01, 0.1, 16, 60)
    return f"[2026/01/01 00:00:00] ppdist INFO: {line}\n"


def _info(text: str) -> str:
    return f"[2026/01/01 00:00:00] ppdist INFO: {text}\n"


def _start(steps: int = 12) -> str:
    return _info(f"1 process(es), device cpu, 4 batches/epoch per process, 3 epochs, {steps} steps")


def _eval(acc: float, step=None) -> str:
    progress = _info(f"eval step {step}: 1/4 batches, eta: 0:00:01") if step is not None else ""
    return progress + _info(f"cur metric, {format_metrics({'acc': acc, 'norm_edit_dis': 0.9})}, fps: 12.00")


def test_parse_train_log_keeps_the_run_as_it_went_on(tmp_path):
    """A resumed training replaces what the interrupted one logged after its resume point; one
    started afresh replaces everything; a re-laid-out resume counts the earlier steps anew."""
    log = tmp_path / "train.log"
    first = [_start(), _train_line(2, 4.0), _train_line(4, 3.0), _eval(0.25, 4), _train_line(6, 2.5)]
    first += [_eval(0.3), _train_line(8, 2.0)]  # no progress line: the eval of the last training line
    log.write_text("".join(first))
    series = parse_train_log(str(log))
    assert series["train/loss"] == {2: 4.0, 4: 3.0, 6: 2.5, 8: 2.0}
    assert series["train/acc"] == {2: 0.5, 4: 0.5, 6: 0.5, 8: 0.5}
    assert series["eval/acc"] == {4: 0.25, 6: 0.3} and series["train/lr"][8] == 0.001
    assert set(series) == {"train/loss", "train/acc", "train/lr", "eval/acc", "eval/norm_edit_dis"}
    assert parse_train_log(str(log), until_step=4)["eval/acc"] == {4: 0.25}
    resumed = [
        _info("resumed from out/latest.pt: epoch 2, batch 0, global_step 4; best so far: acc: 0.250000")
    ]
    resumed += [_start(), _train_line(6, 2.4), _train_line(8, 1.9), _eval(0.5, 8), _train_line(10, 1.5)]
    log.write_text("".join(first + resumed))
    series = parse_train_log(str(log))
    assert series["train/loss"] == {2: 4.0, 4: 3.0, 6: 2.4, 8: 1.9, 10: 1.5}
    assert series["eval/acc"] == {4: 0.25, 8: 0.5}  # the interrupted run's eval at 6 is gone
    relaid = [
        _info(
            "resuming a run of 1 process(es) x 16 per process with 2 x 16 (the same global batch): epoch 2 "
            "continues after 64 of 128 samples with 2 batch(es) left; global_step 8 -> 4; learning rate x1 "
            "of the configured one"
        ),
        _info("resumed from out/latest.pt: epoch 2, batch 2, global_step 4, best -"),  # an older version's
        _start(6),
        _train_line(6, 1.0),
    ]
    log.write_text("".join(first + resumed + relaid))
    assert parse_train_log(str(log))["train/loss"] == {1: 4.0, 2: 3.0, 3: 2.4, 4: 1.9, 6: 1.0}
    log.write_text("".join(first + resumed + [_start(), _train_line(2, 9.0)]))
    assert parse_train_log(str(log)) == {
        "train/loss": {2: 9.0},
        "train/acc": {2: 0.5},
        "train/lr": {2: 0.001},
    }


def test_an_evaluation_lands_at_the_step_its_line_names(tmp_path):
    """``cur metric`` names its global step: an evaluation without progress lines (a small
    evaluation set, the final one after the last training line) is drawn at its own step."""
    line = format_eval_line({"acc": 0.5, "norm_edit_dis": 0.9}, 240.98, 12)
    assert line == "cur metric, acc: 0.500000, norm_edit_dis: 0.900000, fps: 240.98, global_step: 12"
    log = tmp_path / "train.log"
    log.write_text("".join([_start(), _train_line(10, 2.0), _info(line), _eval(0.25)]))
    series = parse_train_log(str(log))
    assert series["eval/acc"] == {12: 0.5, 10: 0.25}  # a line of an older version: the last training step
    assert "eval/global_step" not in series and "eval/fps" not in series


@pytest.mark.slow
def test_curves_png_follows_the_evaluations_and_a_resume(runs, tmp_path, digits_dir):
    curves = os.path.join(runs["slow"], "curves.png")
    assert_picture(curves, (1500, 640))  # loss, lr, acc, norm_edit_dis
    first = runs["hooks"]["slow"].sink.series
    # The slow run was interrupted after step 8; it resumes from its step-4 snapshot in the same
    # folder, evaluating every 6 steps now: its eval at 8 is replaced by those at 6 and 12.
    again = str(tmp_path / "again")
    os.makedirs(again)
    shutil.copy(os.path.join(runs["slow"], "train.log"), os.path.join(again, "train.log"))
    shutil.copy(os.path.join(runs["slow"], "iter_step_4.pt"), os.path.join(again, "iter_step_4.pt"))
    overrides = COMMON + [
        "Global.max_iters=12",
        "Global.eval_batch_step=[0,6]",
        f"Global.checkpoints={os.path.join(again, 'iter_step_4.pt')}",
    ]
    hook = curves_hook(train(tiny_run_config(tmp_path, digits_dir, "again", overrides)))
    series = hook.sink.series  # the checkpoint's values to step 4, then this run's
    assert sorted(series["train/loss"]) == [2, 4, 6, 8, 10, 12]
    assert sorted(series["eval/acc"]) == [4, 6, 12]
    for name in series:
        for step in (2, 4):
            assert series[name].get(step) == first[name].get(step), (name, step)
    from_log = parse_train_log(os.path.join(again, "train.log"))  # both trainings' lines
    assert from_log.keys() == series.keys()
    for name, points in series.items():
        assert from_log[name] == pytest.approx(points, abs=6e-6, rel=1e-6), name
    assert_picture(os.path.join(again, "curves.png"), (1500, 640))
    # a checkpoint without the hook's values (Global.plot_curves was off): train.log to the resume point
    fallback = TrainingCurves()
    fallback.trainer = types.SimpleNamespace(save_dir=again)
    assert fallback.earlier_history(4) == parse_train_log(os.path.join(runs["slow"], "train.log"), 4)
    assert fallback.earlier_history(4)["eval/acc"] == pytest.approx({4: first["eval/acc"][4]}, abs=6e-6)


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
