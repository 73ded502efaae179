"""tools/convert_paddle_weights.py and Paddle weights given straight to the prediction tools."""

import os
import pickle

import cv2
import numpy as np
import pytest
import torch
from ppdist_testing import REPO, check_ok, run_tool

FIXTURE = os.path.join(REPO, "tests", "fixtures", "paddle_rec", "crnn_small.pdparams")
CONFIG = os.path.join(REPO, "configs", "rec", "rec_mv3_none_bilstm_ctc.yml")
SMALL = [
    "Architecture.Backbone.model_name=small",
    "Architecture.Backbone.scale=0.35",
    "Architecture.Backbone.small_stride=[1,2,2,2]",
    "Architecture.Neck.hidden_size=24",
]  # the crnn_small fixture's settings


def test_converts_and_writes_a_weights_only_file(tmp_path):
    out = str(tmp_path / "crnn.pt")
    result = check_ok(
        run_tool(
            [
                "convert_paddle_weights.py",
                "-c",
                CONFIG,
                "-o",
                *SMALL,
                "--pdparams",
                FIXTURE,
                "--out",
                out,
                "--strict",
            ]
        )
    )
    assert "converted 229/229 tensors" in result.stdout and f"wrote {out}" in result.stdout
    data = torch.load(out, weights_only=True)
    assert data["converted_from"] == os.path.abspath(FIXTURE)
    assert data["conversion"] == {"skipped": [], "missing": [], "unused": []}
    assert not os.path.exists(out + ".tmp")

    # the converted file and the .pdparams itself predict the same text and scores
    from ppdist.predict import Predictor

    image = np.full((32, 100, 3), 255, np.uint8)
    cv2.putText(image, "ab12", (4, 24), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2)
    from_pt = Predictor(CONFIG, checkpoint=out, overrides=SMALL)([image])[0]
    from_paddle = Predictor(CONFIG, checkpoint=FIXTURE, overrides=SMALL)([image])[0]
    assert from_pt["text"] == from_paddle["text"] and abs(from_pt["score"] - from_paddle["score"]) < 1e-6


def test_strict_fails_on_another_class_count_and_lists_the_head(tmp_path):
    charset = tmp_path / "dict.txt"
    charset.write_text("\n".join("abcdefghij") + "\n")
    out = str(tmp_path / "crnn.pt")
    result = run_tool(
        [
            "convert_paddle_weights.py",
            "-c",
            CONFIG,
            "-o",
            *SMALL,
            f"Global.character_dict_path={charset}",
            "--pdparams",
            FIXTURE,
            "--out",
            out,
            "--strict",
        ]
    )
    assert result.returncode == 1, result.stderr
    assert "skipped (shape mismatch) (2): head.fc.weight" in result.stdout
    assert (
        "2 tensor(s) skipped and 0 missing (--strict)" in result.stderr and "Traceback" not in result.stderr
    )
    assert set(torch.load(out, weights_only=True)["conversion"]["skipped"][0].split(":")[:1]) == {
        "head.fc.weight"
    }


def test_a_pickle_that_calls_a_function_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "pwned"),))

    evil = str(tmp_path / "evil.pdparams")
    with open(evil, "wb") as handle:
        pickle.dump({"conv.weight": Evil()}, handle)
    result = run_tool(
        ["convert_paddle_weights.py", "-c", CONFIG, "--pdparams", evil, "--out", str(tmp_path / "x.pt")]
    )
    assert result.returncode == 1 and "refused: the file asks for posix.mkdir" in result.stderr
    assert not os.path.exists(tmp_path / "pwned") and not os.path.exists(tmp_path / "x.pt")


@pytest.mark.slow
def test_train_starts_from_paddle_weights(tmp_path, digits_dir):
    """tools/train.py with Global.pretrained_model=<.pdparams>: converted on load, the head of the other
    dictionary (37 -> 11 classes) skipped and listed, the rest taken from the file."""
    from ppdist_testing import tiny_config

    charset = tmp_path / "digits.txt"
    charset.write_text("".join(f"{digit}\n" for digit in "0123456789"))
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "out"), epochs=1, num_train=512)
    neck = "Architecture.Neck={name: SequenceEncoder, encoder_type: rnn, hidden_size: 24}"
    result = check_ok(
        run_tool(
            [
                "train.py",
                "-c",
                cfg,
                "-o",
                neck,
                f"Global.pretrained_model={FIXTURE}",
                f"Global.character_dict_path={charset}",
            ]
        )
    )
    log = result.stdout + result.stderr
    assert f"{FIXTURE}: converted 227/229 tensors" in log
    assert "skipped (shape mismatch) (2): head.fc.weight" in log
    saved = torch.load(str(tmp_path / "out" / "latest.pt"), weights_only=True)
    assert saved["model"]["head.fc.weight"].shape[0] == 11 and saved["position"]["global_step"] == 32


def test_weights_of_another_config_are_refused_without_allow_partial(tmp_path):
    """The small fixture against the config's large backbone used to write a 21/285 file, exit 0."""
    out = tmp_path / "crnn.pt"
    result = run_tool(["convert_paddle_weights.py", "-c", CONFIG, "--pdparams", FIXTURE, "--out", str(out)])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert (
        message.startswith(f"ppdist: error: {FIXTURE}: only ") and "tensors of the model converted" in message
    )
    assert "under 90%" in message and "--allow_partial writes it anyway" in message
    assert not out.exists()
