"""PaddleSeg val.py's test-time flags -> PostProcess keys (tools/eval.py, tools/infer.py)."""

import argparse
import os

import pytest

from ppdist.cli_seg_eval import add_seg_eval_arguments, override_items, seg_eval_overrides
from ppdist.config import load_config
from ppdist.errors import ConfigError

QUICKSTART = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "seg", "quickstart_synth.yml"
)


def _overrides(argv):
    parser = argparse.ArgumentParser()
    add_seg_eval_arguments(parser)
    return seg_eval_overrides(parser.parse_args(argv))


def test_flags_set_the_keys_as_paddleseg_merge_test_config():
    assert _overrides([]) == {}
    assert (
        _overrides(["--scales", "0.5", "--flip_horizontal"]) == {}
    )  # ignored without --aug_eval, as PaddleSeg
    # --aug_eval sets all four keys: scales 1.0 unless given, absent flips off
    assert _overrides(["--aug_eval"]) == {
        "aug_eval": True,
        "scales": 1.0,
        "flip_horizontal": False,
        "flip_vertical": False,
    }
    both = _overrides(
        ["--aug_eval", "--scales", "0.75", "1.25", "--flip_vertical", "--is_slide", "--crop_size", "48", "40"]
        + ["--stride", "32", "24"]
    )
    assert both == {
        "aug_eval": True,
        "scales": [0.75, 1.25],
        "flip_horizontal": False,
        "flip_vertical": True,
        "is_slide": True,
        "crop_size": [48, 40],
        "stride": [32, 24],
    }
    config = load_config(QUICKSTART, ["PostProcess.scales=[2.0]"] + override_items(both))
    assert config["PostProcess"] == dict(both, name="SegPostProcess")


def test_slide_without_its_window_is_one_config_error():
    with pytest.raises(ConfigError, match=r"^--is_slide needs --crop_size W H and --stride W H"):
        _overrides(["--is_slide", "--crop_size", "48", "40"])
    with pytest.raises(
        ConfigError, match=r"PostProcess.stride \[64, 24\] must not exceed PostProcess.crop_size"
    ):
        load_config(
            QUICKSTART,
            override_items(_overrides(["--is_slide", "--crop_size", "48", "40", "--stride", "64", "24"])),
        )
