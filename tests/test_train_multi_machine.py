"""tools/train_multi_machine.py (PaddleDetection's Fleet-era command) is tools/train.py: same main, same behaviour."""

import importlib.util
import os

from ppdist_testing import REPO, run_tool


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"tool_{name}", os.path.join(REPO, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_its_main_is_train_py_main():
    multi, train = load("train_multi_machine"), load("train")
    assert (
        multi.main.__code__.co_filename
        == train.main.__code__.co_filename
        == os.path.join(REPO, "tools", "train.py")
    )
    assert multi.main.__code__.co_code == train.main.__code__.co_code
    assert multi.main.__module__ == "ppdist_tools_train" and multi.main.__doc__ == train.main.__doc__


def test_same_help_and_same_refusal_as_train_py(tmp_path):
    helps = [run_tool([name, "--help"]) for name in ("train.py", "train_multi_machine.py")]
    assert helps[0].returncode == helps[1].returncode == 0
    usage, text = helps[0].stdout.split("\n\n", 1)  # the usage line differs by the program's name only
    assert usage.startswith("usage: train.py ") and helps[1].stdout.startswith(
        "usage: train_multi_machine.py "
    )
    assert helps[1].stdout.split("\n\n", 1)[1] == text and "--eval" in text
    missing = str(tmp_path / "nope.yml")
    errors = [run_tool([name, "-c", missing]) for name in ("train.py", "train_multi_machine.py")]
    assert errors[0].returncode == errors[1].returncode == 2
    assert errors[0].stderr == errors[1].stderr and missing in errors[0].stderr
