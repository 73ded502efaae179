"""Paddle weights through the checkpoint entry points: prefixes, pretrained, eval, backbone-only."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch
from torch import nn

from ppdist.config import load_config
from ppdist.convert.weights.pdparams import load_pdparams
from ppdist.engine import checkpoint as ckpt
from ppdist.errors import CheckpointError, ConfigError

HERE = os.path.dirname(__file__)
FIXTURE = os.path.join(HERE, "..", "fixtures", "paddle_io", "tiny.pdparams")
REC_CONFIG = os.path.join(HERE, "..", "..", "configs", "rec", "rec_mv3_none_bilstm_ctc.yml")


class Tiny(nn.Module):
    def __init__(self, classes: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.lstm = nn.LSTM(4, 3, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(6, classes)


class WithBackbone(nn.Module):
    """A model whose ``backbone`` stage is Tiny (what Architecture.Backbone.pretrained fills)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = Tiny()
        self.head = nn.Linear(2, 3)


@pytest.fixture()
def paddle_prefix(tmp_path):
    """A PaddleOCR-style prefix: ``.../best_accuracy`` with ``best_accuracy.pdparams`` beside it."""
    shutil.copy(FIXTURE, tmp_path / "best_accuracy.pdparams")
    return str(tmp_path / "best_accuracy")


def test_paddle_prefix_resolves_to_pdparams(paddle_prefix):
    assert ckpt.checkpoint_path(paddle_prefix) == paddle_prefix + ".pdparams"
    assert ckpt.checkpoint_path(paddle_prefix + ".pdparams") == paddle_prefix + ".pdparams"


def test_pretrained_model_converts_paddle_weights(paddle_prefix, caplog):
    caplog.set_level("INFO", logger="ppdist")
    model = Tiny(classes=5)  # another class count: fc skipped and listed, the rest loaded
    ckpt.load_pretrained(model, paddle_prefix)
    reference = load_pdparams(FIXTURE)
    np.testing.assert_array_equal(model.bn.running_var.numpy(), reference["bn._variance"])
    assert "skipped (shape mismatch) (2)" in caplog.text and "converted 14/16" in caplog.text


def test_eval_weights_from_paddle_must_fit(paddle_prefix):
    data = ckpt.load_file(ckpt.checkpoint_path(paddle_prefix))
    model = Tiny()
    ckpt.load_inference_weights(model, data, paddle_prefix)
    np.testing.assert_array_equal(model.fc.weight.detach().numpy(), load_pdparams(FIXTURE)["fc.weight"].T)
    with pytest.raises(ConfigError, match="does not fit Architecture"):
        ckpt.load_inference_weights(Tiny(classes=5), data, paddle_prefix)


def test_resume_from_paddle_weights_is_refused_clearly(paddle_prefix):
    data = ckpt.load_file(ckpt.checkpoint_path(paddle_prefix))
    assert "optimizer" not in data  # the trainer's "holds weights only; use Global.pretrained_model" error


def test_nothing_fitting_is_an_error(paddle_prefix):
    with pytest.raises(CheckpointError, match="none of its 24 tensors fits"):
        ckpt.load_pretrained(nn.Sequential(nn.Linear(2, 2)), paddle_prefix)


def _save_paddle_like(state, path):
    """A Paddle-form state dict pickle (name -> ndarray), as paddle.save writes one, made without Paddle."""
    import pickle

    with open(path, "wb") as handle:
        pickle.dump({k: np.asarray(v) for k, v in state.items()}, handle, protocol=4)


@pytest.mark.parametrize("prefix", ["", "backbone."])
def test_backbone_pretrained_from_paddle(tmp_path, prefix):
    """ImageNet backbone files hold the backbone's keys alone (plus a classifier); a whole model's file
    has them under ``backbone.``: both fill the backbone and leave the rest as initialised."""
    state = {prefix + k: v for k, v in load_pdparams(FIXTURE).items()}
    state["classifier.weight"] = np.zeros((2, 1000), np.float32)  # e.g. the ImageNet head: unused
    path = str(tmp_path / "backbone.pdparams")
    _save_paddle_like(state, path)
    model = WithBackbone()
    head_before = model.head.weight.detach().clone()
    ckpt.load_stage_pretrained(model, "backbone", path)
    np.testing.assert_array_equal(model.backbone.fc.weight.detach().numpy(), state[prefix + "fc.weight"].T)
    assert torch.equal(model.head.weight, head_before)


def test_backbone_pretrained_from_ppdist_file(tmp_path):
    source = WithBackbone()
    path = str(tmp_path / "full.pt")
    ckpt.save_atomic({"model": source.state_dict()}, path)
    model = WithBackbone()
    ckpt.load_stage_pretrained(model, "backbone", path)
    assert torch.equal(model.backbone.conv.weight, source.backbone.conv.weight)
    assert not torch.equal(model.head.weight, source.head.weight)


def test_initial_weights_backbone_then_model(tmp_path, paddle_prefix):
    config = load_config(REC_CONFIG)
    from ppdist.components import build_model

    donor = build_model(config)
    path = str(tmp_path / "donor.pt")
    ckpt.save_atomic({"model": donor.state_dict()}, path)
    config["Architecture"]["Backbone"]["pretrained"] = path
    model = build_model(config)  # the key is not a constructor argument
    assert ckpt.load_initial_weights(model, config)
    assert torch.equal(model.backbone.conv1.conv.weight, donor.backbone.conv1.conv.weight)
    assert not torch.equal(model.head.fc.weight, donor.head.fc.weight)
    config["Architecture"]["Backbone"]["pretrained"] = None
    assert not ckpt.load_initial_weights(model, config)


@pytest.mark.parametrize(
    "value, message",
    [
        ("https://paddle-imagenet-models/MobileNetV3_pretrained.pdparams", "is a URL"),
        (3, "must be a weights path"),
    ],
)
def test_backbone_pretrained_key_is_checked(value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REC_CONFIG, [f"Architecture.Backbone.pretrained={value}"])
