"""PaddleOCR's -p/--profiler_options string: parsed to its options, refused by name when wrong."""

from __future__ import annotations

import pytest
from ppdist_testing import tiny_config

from ppdist.config import ProfilerOptions, load_config, parse_profiler_options
from ppdist.config.profiler_options import OPTIONS
from ppdist.errors import ConfigError


def test_paddleocr_string_parses():
    options = parse_profiler_options(
        "batch_range=[10,20]; state=GPU;tracer_option=Default;profile_path=model.profile;exit_on_finished=false"
    )
    assert options == ProfilerOptions(
        batch_range=(10, 20), state="GPU", profile_path="model.profile", exit_on_finished=False
    )


def test_defaults_are_paddleocrs_except_timer_only():
    options = parse_profiler_options("profile_path=/tmp/p;")
    assert options.batch_range == (10, 20) and options.state == "All" and options.exit_on_finished
    assert options.timer_only is False and options.ranks == 0  # a trace, from rank 0


def test_choices_are_case_insensitive_and_ranks_take_all():
    options = parse_profiler_options("state=gpu;sorted_key=ave;tracer_option=opdetail;timer_only=1;ranks=all")
    assert (options.state, options.sorted_key, options.tracer_option) == ("GPU", "ave", "OpDetail")
    assert options.timer_only and options.ranks is None


@pytest.mark.parametrize(
    "text, problem",
    [
        ("batch_range=[10,20];colour=red", "unknown option 'colour'"),
        ("batch_range=[10,20];state", "'state' is not key=value"),
        ("batch_range=[20,10]", r"needs 0 <= start < end"),
        ("batch_range=[1,2,3]", r"batch_range must be \[start,end\] integers"),
        ("batch_range=[a,b]", r"batch_range must be \[start,end\] integers"),
        ("state=TPU", "state must be one of CPU, GPU, All"),
        ("exit_on_finished=maybe", "exit_on_finished must be true or false"),
        ("ranks=first", "ranks must be a rank number"),
        (";", "no option given"),
    ],
)
def test_a_bad_string_names_the_key_the_problem_and_the_options(text, problem):
    with pytest.raises(ConfigError, match=problem) as caught:
        parse_profiler_options(text)
    assert "Global.profiler_options" in str(caught.value) and ", ".join(OPTIONS) in str(caught.value)


def test_validation_checks_the_string(tmp_path):
    path = tiny_config(str(tmp_path / "c.yml"), str(tmp_path / "data"), str(tmp_path / "out"))
    config = load_config(path, ["Global.profiler_options='batch_range=[3,5]'"])
    assert config["Global"]["profiler_options"] == "batch_range=[3,5]"
    with pytest.raises(ConfigError, match="unknown option 'batch'"):
        load_config(path, ["Global.profiler_options='batch=[3,5]'"])
