"""Synthetic data settings out of range: one line naming the setting, from the config
(``Global.synthetic_data.<key>``) and from tools/make_synthetic_data.py (``--<option>``, exit 2)."""

import importlib.util
import os

import pytest

from ppdist.engine.dist import DistEnv
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    "make_synthetic_data", os.path.join(REPO, "tools", "make_synthetic_data.py")
)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


@pytest.mark.parametrize(
    "kind, setting, value, message",
    [
        (
            "table",
            "max_rows",
            1,
            r"Global.synthetic_data.max_rows must be a whole number in \[2, 30\], got 1",
        ),
        ("table", "num_train", 0, r"Global.synthetic_data.num_train must be a whole number >= 1, got 0"),
        ("table", "cell_width", "wide", r"Global.synthetic_data.cell_width must be \[low, high\]"),
        ("rec", "min_len", 0, r"Global.synthetic_data.min_len must be a whole number >= 1, got 0"),
        ("rec", "num_val", 2.5, r"Global.synthetic_data.num_val must be a whole number >= 1, got 2.5"),
        ("rec_ppocrv3", "max_chars", 0, r"Global.synthetic_data.max_chars must be a whole number >= 1"),
        (
            "seg",
            "image_size",
            [64, "x"],
            r"Global.synthetic_data.image_size must be a side or \[width, height\]",
        ),
        (
            "det",
            "num_classes",
            0,
            r"Global.synthetic_data.num_classes must be a whole number in \[1, 7\], got 0",
        ),
        ("det", "empty_ratio", 1.0, r"Global.synthetic_data.empty_ratio must be in \[0, 1\), got 1.0"),
    ],
)
def test_a_bad_global_synthetic_data_setting_is_one_config_error(tmp_path, kind, setting, value, message):
    spec = {"kind": kind, "data_dir": str(tmp_path / "data"), "num_train": 2, "num_val": 1, setting: value}
    with pytest.raises(ConfigError, match=message):
        ensure_synthetic_data({"Global": {"synthetic_data": spec}}, DistEnv())
    assert not os.path.exists(tmp_path / "data")  # nothing written


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["table", "--num", "0"],
            "make_synthetic_data.py table: error: --num must be a whole number >= 1, got 0",
        ),
        (["table", "--num", "4", "--max_rows", "1"], "--max_rows must be a whole number in [2, 30], got 1"),
        (["rec_ppocrv3", "--num", "4", "--max_chars", "0"], "--max_chars must be a whole number >= 1"),
        (["rec", "--num", "4", "--num_val", "0"], "--num_val must be a whole number >= 1, got 0"),
        (["seg", "--num", "4", "--image_size", "8"], "--image_size must be a side or [width, height]"),
    ],
)
def test_a_bad_tool_argument_exits_2_with_one_line(tmp_path, capsys, args, message):
    out = str(tmp_path / "data")
    with pytest.raises(SystemExit) as stopped:
        tool.main(args[:1] + ["--out", out] + args[1:])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not os.path.exists(out)
