"""tools/train.py's command line: PaddleOCR's -c/-o unchanged, PaddleDetection's and PaddleSeg's flags
with their suites' meaning (Paddle-key overrides applied before the conversion), clear messages for
the flags with no ppdist equivalent."""

from __future__ import annotations

import os

import pytest
from ppdist_testing import REPO, run_tool

from ppdist.cli import base_parser
from ppdist.cli_compat import parse_train_args, train_command
from ppdist.config import dump_config, load_config, load_yaml_with_bases
from ppdist.errors import ConfigError

FIXTURES = os.path.join(REPO, "tests", "fixtures", "paddle_configs")
DET = os.path.join(FIXTURES, "PaddleDetection", "configs", "ppyoloe", "ppyoloe_crn_s_300e_coco.yml")
SEG = os.path.join(
    FIXTURES, "PaddleSeg", "configs", "pp_liteseg", "pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml"
)
PPDIST_DET = os.path.join(REPO, "configs", "det", "quickstart_synth.yml")
PPDIST_REC = os.path.join(REPO, "configs", "rec", "quickstart_synth.yml")


def command(*argv: str):
    return train_command(parse_train_args("test", list(argv)))


def value(config, path: str):
    node = config
    for part in path.split("."):
        node = node[part]
    return node


# --------------------------------------------------------------------------- PaddleOCR / ppdist
def test_paddleocr_c_and_o_are_unchanged():
    overrides = ["Global.epoch_num=3", "Train.loader.num_workers=0", "Optimizer.lr.learning_rate=0.5"]
    result = command("-c", PPDIST_REC, "-o", *overrides)
    assert result.config == load_config(PPDIST_REC, overrides) and result.conversion is None
    assert result.notes == []
    with pytest.raises(ConfigError, match="unknown section 'epoch'"):
        command("-c", PPDIST_REC, "-o", "epoch=2")


@pytest.mark.parametrize(
    "flags, key, expected",
    [
        (["--iters", "40"], "Global.max_iters", 40),
        (["--save_dir", "out/run1"], "Global.save_model_dir", "out/run1"),
        (["--resume_model", "out/latest"], "Global.checkpoints", "out/latest"),
        (["-r", "out/latest"], "Global.checkpoints", "out/latest"),
        (["--resume", "out/latest"], "Global.checkpoints", "out/latest"),
        (["--precision", "fp16"], "Global.use_amp", True),
        (["--precision", "fp16"], "Global.amp_dtype", "float16"),
        (["--amp"], "Global.use_amp", True),
        (["--amp_level", "O2"], "Global.amp_level", "O2"),
        (["--device", "cpu"], "Global.use_gpu", False),
        (["--device", "gpu"], "Global.use_gpu", True),
        (["--use_vdl"], "Global.use_visualdl", True),
        (["--use_vdl", "True"], "Global.use_visualdl", True),
        (["--log_iters", "7"], "Global.print_batch_step", 7),
        (["--batch_size", "3"], "Train.loader.batch_size_per_card", 3),
        (["--num_workers", "0"], "Train.loader.num_workers", 0),
        (["--learning_rate", "0.002"], "Optimizer.lr.learning_rate", 0.002),
        (["--save_interval", "50"], "Global.save_iter_step", 50),
        (["--save_interval", "50"], "Global.eval_batch_step", [0, 50]),
        (["--save_interval", "50"], "Global.eval_batch_epoch", None),
        (["--keep_checkpoint_max", "3"], "Global.keep_checkpoint_max", 3),
        (["--keep_checkpoint_max", "0"], "Global.keep_checkpoint_max", None),
        (["--seed", "7"], "Global.seed", 7),
        (["--enable_ce", "True"], "Global.seed", 0),
        (["--use_ema"], "Global.use_ema", True),
        (["--early_stop_intervals", "3"], "Global.early_stop", {"patience": 3, "min_delta": 0.0}),
        (["--data_format", "NHWC"], "Global.channels_last", True),
        (["--eval"], "Global.eval_during_train", True),  # a ppdist config evaluates as before
        ([], "Global.eval_during_train", True),
    ],
)
def test_flag_sets_the_ppdist_key_on_a_ppdist_config(flags, key, expected):
    assert value(command("-c", PPDIST_DET, *flags).config, key) == expected


def test_o_wins_over_a_flag_and_flags_keep_the_rest_of_the_config():
    config = command("-c", PPDIST_DET, "--iters", "40", "-o", "Global.max_iters=9").config
    assert config["Global"]["max_iters"] == 9
    assert config["Global"]["num_classes"] == 4  # the rest of the quick-start config is untouched


def test_learning_rate_scales_a_piecewise_schedule(tmp_path):
    config = load_yaml_with_bases(PPDIST_REC)
    config["Optimizer"]["lr"] = {"name": "Piecewise", "decay_epochs": [2], "values": [0.1, 0.01]}
    path = str(tmp_path / "piecewise.yml")
    dump_config(config, path)
    result = command("-c", path, "--learning_rate", "0.5")
    assert result.config["Optimizer"]["lr"]["values"] == pytest.approx([0.5, 0.05])
    assert any("scaled" in note for note in result.notes)


def test_profiler_options_become_the_global_key():
    result = command("-c", PPDIST_DET, "-p", "batch_range=[10,20];profile_path=/tmp/prof")
    assert result.config["Global"]["profiler_options"] == "batch_range=[10,20];profile_path=/tmp/prof"


# --------------------------------------------------------------------------- PaddleDetection
def test_paddledetection_o_keys_apply_before_the_conversion():
    result = command(
        "-c", DET, "-o", "use_gpu=false", "epoch=2", "TrainReader.batch_size=2", "LearningRate.base_lr=0.001"
    )
    glob = result.config["Global"]
    assert (glob["use_gpu"], glob["epoch_num"]) == (False, 2)
    assert result.config["Train"]["loader"]["batch_size_per_card"] == 2
    lr = result.config["Optimizer"]["lr"]
    assert lr["learning_rate"] == 0.001 and lr["name"] == "CosineDecay"
    assert result.conversion is not None and result.conversion.config["Global"]["epoch_num"] == 2


def test_paddledetection_o_mixes_paddle_and_ppdist_keys():
    config = command("-c", DET, "-o", "epoch=2", "Global.epoch_num=5", "snapshot_epoch=3").config
    assert config["Global"]["epoch_num"] == 5  # a ppdist key acts on the converted config, last
    assert config["Global"]["save_epoch_step"] == 3 and config["Global"]["eval_batch_epoch"] == 3


def test_paddledetection_eval_switches_evaluation_during_training():
    assert command("-c", DET).config["Global"]["eval_during_train"] is False
    result = command("-c", DET, "--eval")
    assert result.config["Global"]["eval_during_train"] is True
    assert not any("--eval" in note for note in result.notes)
    assert any("add --eval" in note for note in command("-c", DET).notes)


def test_paddledetection_amp_and_use_vdl_as_its_merge_args():
    """PaddleDetection copies --amp / --use_vdl into its config, so the flag decides (and -o after it)."""
    off = command("-c", DET, "-o", "Global.print_batch_step=1").config["Global"]
    assert (off["use_amp"], off["use_tensorboard"]) == (False, False)
    on = command("-c", DET, "--amp", "--use_vdl", "True").config["Global"]
    assert (on["use_amp"], on["use_tensorboard"]) == (True, True)
    assert command("-c", DET, "--use_vdl", "false").config["Global"]["use_tensorboard"] is False
    assert command("-c", DET, "-o", "amp=true").config["Global"]["use_amp"] is True


def test_paddledetection_learning_rate_and_resume():
    config = command("-c", DET, "--learning_rate", "0.004", "-r", "output/ppyoloe/10").config
    assert config["Optimizer"]["lr"]["learning_rate"] == 0.004
    assert config["Optimizer"]["lr"]["warmup_start_lr"] == 0.0  # start_factor 0 of the new base_lr
    assert config["Global"]["checkpoints"] == "output/ppyoloe/10"


def test_a_bad_paddle_override_names_the_file_and_the_item():
    with pytest.raises(ConfigError, match=r"ppyoloe_crn_s_300e_coco.yml: -o 'epoch': expected key=value"):
        command("-c", DET, "-o", "epoch")


# --------------------------------------------------------------------------- PaddleSeg
def test_paddleseg_flags_apply_to_its_config_before_the_conversion():
    result = command(
        "--config", SEG, "--iters", "40", "--batch_size", "3", "--learning_rate", "0.5", "--opts",
        "test_config.aug_eval=True", "test_config.scales=0.75,1.0",
    )  # fmt: skip
    config = result.config
    assert config["Global"]["max_iters"] == 40 and config["Train"]["loader"]["batch_size_per_card"] == 3
    assert config["Optimizer"]["lr"]["learning_rate"] == 0.5
    assert config["PostProcess"]["aug_eval"] is True and config["PostProcess"]["scales"] == [0.75, 1.0]
    assert result.conversion.config["Global"]["max_iters"] == 40  # what converted_config.yml shows


def test_paddleseg_run_flags():
    config = command(
        "--config", SEG, "--do_eval", "--save_interval", "7", "--precision", "fp16", "--device", "cpu",
        "--keep_checkpoint_max", "2", "--use_vdl", "--num_workers", "3", "--log_iters", "4",
        "--save_dir", "out/x", "--use_ema", "--seed", "5",
    ).config  # fmt: skip
    glob = config["Global"]
    assert glob["eval_during_train"] is True
    assert (glob["save_iter_step"], glob["eval_batch_step"]) == (7, [0, 7])
    assert (glob["use_amp"], glob["amp_dtype"], glob["scale_loss"]) == (True, "float16", 1024.0)
    assert (glob["use_gpu"], glob["keep_checkpoint_max"], glob["use_visualdl"]) == (False, 2, True)
    assert (glob["print_batch_step"], glob["log_smooth_window"], glob["save_model_dir"]) == (4, 4, "out/x")
    assert (glob["use_ema"], glob["ema_decay"], glob["seed"]) == (True, 0.999, 5)
    assert config["Train"]["loader"]["num_workers"] == 3 and config["Eval"]["loader"]["num_workers"] == 1


def test_paddleseg_evaluates_only_with_do_eval():
    assert command("--config", SEG).config["Global"]["eval_during_train"] is False
    assert command("--config", SEG, "--do_eval").config["Global"]["eval_during_train"] is True


def test_paddleseg_opts_needs_existing_parent_keys():
    with pytest.raises(ConfigError, match=r"--opts 'nothere.x=1': nothere is not in the config"):
        command("--config", SEG, "--opts", "nothere.x=1")
    config = command("--config", SEG, "--opts", "Global.print_batch_step=3").config
    assert config["Global"]["print_batch_step"] == 3  # a ppdist key, on the converted config


# --------------------------------------------------------------------------- no equivalent
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--slim_config", "slim.yml"], "--slim_config slim.yml: not supported"),
        (["--repeats", "2"], "--repeats 2: not supported"),
        (["--device", "xpu"], "--device xpu: not supported"),
        (["--use_multilabel"], "--use_multilabel: not supported"),
    ],
)
def test_flags_that_would_change_training_are_errors(flags, message):
    with pytest.raises(ConfigError, match=message):
        command("-c", PPDIST_DET, *flags)


@pytest.mark.parametrize(
    "flags, note",
    [
        (["--fleet"], "--fleet: ignored"),
        (["--vdl_log_dir", "vdl"], "--vdl_log_dir: ignored"),
        (["--save_prediction_only"], "--save_prediction_only: ignored"),
        (["--save_proposals", "--proposals_path", "p.json"], "--save_proposals: ignored"),
        (["--to_static"], "--to_static: ignored"),
        (["--data_format", "NHWC"], "--data_format NHWC: Global.channels_last true"),
        (["--early_stop_intervals", "2"], "--early_stop_intervals 2: Global.early_stop patience 2"),
    ],
)
def test_harmless_flags_with_no_equivalent_are_one_line_notes(flags, note):
    notes = command("-c", PPDIST_DET, *flags).notes
    assert any(line.startswith(note) for line in notes), notes
    assert all("\n" not in line for line in notes)


def test_train_tool_exits_2_with_one_line_for_a_flag_it_cannot_honour():
    result = run_tool(["train.py", "--config", PPDIST_DET, "--slim_config", "x.yml"])
    assert result.returncode == 2 and "unrecognized arguments" not in result.stderr
    assert result.stderr.strip() == (
        "ppdist: config error: --slim_config x.yml: not supported: ppdist has no PaddleSlim pruning, "
        "quantization or distillation; train without it"
    )


def test_two_checkpoints_to_resume_are_refused():
    """-r A --resume_model B used to resume A silently."""
    with pytest.raises(
        ConfigError, match="-r a.pt and --resume_model b.pt: two checkpoints to resume; give one"
    ):
        command("-c", PPDIST_DET, "-r", "a.pt", "--resume_model", "b.pt")


def test_only_train_takes_profiler_options():
    """eval/infer/export/benchmark listed a -p they ignored."""
    assert parse_train_args("t", ["-c", "x.yml", "-p", "batch_range=[1,2]"]).profiler_options
    with pytest.raises(SystemExit):
        base_parser("eval").parse_args(["-c", "x.yml", "-p", "batch_range=[1,2]"])


@pytest.mark.parametrize("flag", ["--iters", "--batch_size", "--save_interval", "--log_iters"])
def test_paddleseg_counts_below_one_are_refused_not_ignored(flag, capsys):
    """--iters 0 used to be dropped silently (the config's max_iters trained)."""
    with pytest.raises(SystemExit) as info:
        parse_train_args("t", ["-c", "x.yml", flag, "0"])
    assert info.value.code == 2
    assert f"argument {flag}: expected a positive integer, got 0" in capsys.readouterr().err
