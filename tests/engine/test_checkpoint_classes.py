"""A checkpoint records what its classes mean (a recognition model's dictionary) and is refused when
evaluated, exported or resumed with other classes: a dictionary of the same size but other
characters (which loads without a shape mismatch and gives wrong metrics), or of another size
(the message says that the class count comes from the dictionary and names the checkpoint's).
Checkpoints without the record still load."""

import logging
import string

import pytest
import torch
from ppdist_testing import tiny_run_config

from ppdist.components import build_model, class_vocabulary
from ppdist.engine import checkpoint as ckpt
from ppdist.engine.dist import DistEnv
from ppdist.engine.logger import setup_logger
from ppdist.engine.setup import build_trainer
from ppdist.errors import CheckpointError, ConfigError
from ppdist.eval_runner import evaluate_checkpoint
from ppdist.export.model_export import load_trained_model

DEFAULT = string.digits + string.ascii_lowercase  # PaddleOCR's default dictionary (no path)


def dictionary(tmp_path, name, characters):
    path = tmp_path / name
    path.write_text("".join(f"{c}\n" for c in characters))
    return str(path)


@pytest.fixture
def trained(tmp_path, digits_dir):
    """A checkpoint as a run writes it (its record included), of the default dictionary."""
    setup_logger(None)
    trainer = build_trainer(tiny_run_config(tmp_path, digits_dir, "a"), DistEnv())
    state = trainer.state_dict()
    path = str(tmp_path / "a.pt")
    ckpt.save_atomic(state, path)
    return path, state


def config_with(tmp_path, digits_dir, characters, weights):
    dict_path = dictionary(tmp_path, "dict.txt", characters)
    overrides = [f"Global.character_dict_path={dict_path}", f"Global.checkpoints={weights}"]
    return tiny_run_config(tmp_path, digits_dir, "b", overrides), dict_path


def test_a_run_writes_the_dictionary_into_its_checkpoints(trained):
    _, state = trained
    assert state[ckpt.CLASSES_KEY] == {
        "classes": ["blank"] + list(DEFAULT),
        "dictionary": None,
        "key": "Global.character_dict_path",
    }


def test_a_dictionary_of_the_same_size_but_other_characters_is_refused_naming_both(
    tmp_path, digits_dir, trained
):
    path, _ = trained
    swapped = DEFAULT[:10] + DEFAULT[10:].upper()  # 36 characters, the letters upper-case
    config, dict_path = config_with(tmp_path, digits_dir, swapped, path)
    expected = (
        f"{path} was trained with other classes than this config's: its dictionary, the default dictionary "
        f"(0-9a-z), and Global.character_dict_path {dict_path} both have 37 classes but 26 differ (class 11 is "
        f"'a' in the checkpoint, 'A' here), so its predictions would be read as the wrong characters; set "
        f"Global.character_dict_path to the checkpoint's dictionary"
    )
    with pytest.raises(ConfigError) as evaluated:
        evaluate_checkpoint(config, DistEnv())
    assert str(evaluated.value) == expected
    with pytest.raises(ConfigError) as exported:
        load_trained_model(config)
    assert str(exported.value) == expected
    resumed = build_trainer(config_with(tmp_path, digits_dir, swapped, "")[0], DistEnv())
    with pytest.raises(ConfigError) as caught:
        resumed.load_state_dict(ckpt.load_file(path), path)
    assert str(caught.value) == expected


def test_a_dictionary_of_another_size_names_the_checkpoints_count(tmp_path, digits_dir, trained, caplog):
    path, state = trained
    config, dict_path = config_with(tmp_path, digits_dir, string.digits, path)
    with pytest.raises(
        ConfigError,
        match=r"was trained with 37 classes \(its dictionary, the default dictionary "
        r"\(0-9a-z\)\) and this config gives 11: the head's class count comes from the dictionary "
        rf"\(Global.character_dict_path {dict_path}\)",
    ):
        evaluate_checkpoint(config, DistEnv())
    old = str(tmp_path / "old.pt")  # written before checkpoints held the record: the shapes tell
    torch.save({"model": state["model"]}, old)
    config["Global"]["checkpoints"] = old
    with caplog.at_level(logging.WARNING, logger="ppdist"), pytest.raises(ConfigError) as caught:
        evaluate_checkpoint(config, DistEnv())
    assert str(caught.value) == (
        f"{old} does not fit Architecture: 2 shape mismatch(es), 0 missing tensor(s) (see the warnings above); "
        f"the head's class count comes from the dictionary (Global.character_dict_path {dict_path}: 11 classes) "
        f"and the checkpoint's head has 37: use the dictionary it was trained with"
    )
    assert "not in" not in caplog.text  # the head's tensors are listed once, as mismatches
    assert caplog.text.count("skipped (shape mismatch)") == 2
    resumed = build_trainer(config_with(tmp_path, digits_dir, string.digits, "")[0], DistEnv())
    with pytest.raises(
        CheckpointError, match="the checkpoint's head has 37: use the dictionary it was trained with"
    ):
        resumed.load_state_dict(dict(state, **{ckpt.CLASSES_KEY: None}), "old")


def test_a_checkpoint_without_the_record_or_with_a_copy_of_the_dictionary_loads(tmp_path, digits_dir):
    config = tiny_run_config(tmp_path, digits_dir, "a")
    classes = class_vocabulary(config)
    for data in (
        {"model": build_model(config).state_dict()},  # older checkpoints: no record
        {"model": build_model(config).state_dict(), ckpt.CLASSES_KEY: dict(classes, dictionary="copy.txt")},
    ):
        model = build_model(config)
        ckpt.load_inference_weights(model, data, "w.pt", classes)
        assert all(torch.equal(value, data["model"][key]) for key, value in model.state_dict().items())
