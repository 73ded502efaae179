"""The trackers' settings: Global.mlflow, Global.use_wandb and PaddleOCR's wandb section, checked
at validation, with the pip command when the package a config asks for is missing."""

from __future__ import annotations

import sys

import pytest
import yaml
from ppdist_testing import tiny_config

from ppdist.config import load_config, mlflow_settings, wandb_settings
from ppdist.errors import ConfigError


@pytest.fixture
def config_path(tmp_path):
    return tiny_config(str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))


def with_wandb_section(path, section):
    with open(path) as handle:
        config = yaml.safe_load(handle)
    config["wandb"] = section
    with open(path, "w") as handle:
        yaml.safe_dump(config, handle)
    return path


def test_mlflow_settings_fill_defaults():
    assert mlflow_settings({"mlflow": None}) is None and mlflow_settings({"mlflow": False}) is None
    assert mlflow_settings({"mlflow": True}) == {
        "tracking_uri": None,
        "experiment_name": "ppdist",
        "run_name": None,
        "tags": {},
    }
    spec = {"tracking_uri": "http://mlflow:5000", "tags": {"team": "ocr", "gpus": 8}}
    assert mlflow_settings({"mlflow": spec})["tags"] == {"team": "ocr", "gpus": "8"}


def test_wandb_is_on_with_use_wandb_or_a_wandb_section_unless_use_wandb_is_false():
    assert wandb_settings({"Global": {"use_wandb": None}}) is None
    assert wandb_settings({"Global": {"use_wandb": True}}) == {}
    section = {"project": "rec", "entity": "me", "save_dir": "./wb", "mode": "offline", "tags": ["a"]}
    assert wandb_settings({"Global": {"use_wandb": None}, "wandb": section}) == {
        "project": "rec",
        "entity": "me",
        "dir": "./wb",  # PaddleOCR's save_dir is wandb.init's dir
        "mode": "offline",
        "tags": ["a"],
    }
    assert wandb_settings({"Global": {"use_wandb": False}, "wandb": section}) is None


def test_a_paddleocr_wandb_section_is_an_accepted_section(config_path):
    config = load_config(with_wandb_section(config_path, {"project": "rec"}), ["wandb.mode=offline"])
    assert config["wandb"] == {"project": "rec", "mode": "offline"}
    assert wandb_settings(config) == {"project": "rec", "mode": "offline"}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["Global.mlflow={experiment: x}"],
            r"unknown key Global\.mlflow\.experiment\. Did you mean: 'experiment_name'",
        ),
        (["Global.mlflow={tags: [a]}"], r"Global\.mlflow\.tags must be a mapping"),
        (["Global.mlflow=yes please"], r"wrong type for Global\.mlflow"),
        (["wandb.projekt=x"], r"unknown key wandb\.projekt\. Did you mean: 'project'"),
        (["wandb.mode=cloud"], r"wandb\.mode must be one of \['online', 'offline', 'disabled'\]"),
        (["wandb.tags=x"], r"wandb\.tags must be a list of strings"),
        (["Global.tracker_checkpoints=all"], r"Global\.tracker_checkpoints must be one of"),
    ],
)
def test_bad_tracker_settings_are_refused_by_name(config_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(config_path, overrides)


@pytest.mark.parametrize(
    "module, overrides, command",
    [
        ("mlflow", ["Global.mlflow=true"], "pip install mlflow-skinny"),
        ("wandb", ["Global.use_wandb=true"], "pip install wandb"),
    ],
)
def test_a_missing_package_names_the_pip_command(config_path, monkeypatch, module, overrides, command):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ConfigError, match=f"asks for {module}, which is not installed: {command} ") as caught:
        load_config(config_path, overrides)
    assert ".[trackers]" in str(caught.value)
    load_config(config_path)  # not asked for: no check
