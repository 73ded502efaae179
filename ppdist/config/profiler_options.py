"""``Global.profiler_options``: PaddleOCR's ``-p/--profiler_options`` string, parsed and checked.

The string is ``key=value`` pairs joined by ``;``, e.g.
``batch_range=[10,20];state=GPU;tracer_option=Default;profile_path=model.profile``. Every option
has PaddleOCR's meaning where torch has one (docs/experiment_tracking.md); ``ranks`` is ppdist's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from ppdist.errors import ConfigError

KEY = "Global.profiler_options"
STATES = ("CPU", "GPU", "All")
SORTED_KEYS = ("calls", "total", "max", "min", "ave")
TRACER_OPTIONS = ("Default", "OpDetail", "AllOpDetail")
TRUE_WORDS = ("yes", "true", "t", "1")
FALSE_WORDS = ("no", "false", "f", "0")
OPTIONS = (
    "batch_range",
    "state",
    "sorted_key",
    "tracer_option",
    "profile_path",
    "exit_on_finished",
    "timer_only",
    "ranks",
)
EXAMPLE = "batch_range=[10,20];state=GPU;tracer_option=Default;profile_path=model.profile"


@dataclass(frozen=True)
class ProfilerOptions:
    """The profiled window ``batch_range = [start, end)`` in 0-based step indices (the step that
    begins at global_step ``start`` is the first, the one ending at ``end`` the last), what is
    traced, where the trace goes (None: ``save_model_dir/profiler``), whether the run ends after
    the window, and which rank profiles (None: every rank)."""

    batch_range: Tuple[int, int] = (10, 20)
    state: str = "All"
    sorted_key: str = "total"
    tracer_option: str = "Default"
    profile_path: Optional[str] = None
    exit_on_finished: bool = True
    timer_only: bool = False
    ranks: Optional[int] = 0


def _fail(text: str, problem: str) -> ConfigError:
    return ConfigError(
        f"{KEY} {text!r}: {problem}; the format is key=value pairs joined by ';' (PaddleOCR's "
        f"-p/--profiler_options, e.g. {EXAMPLE!r}) with the options {', '.join(OPTIONS)}"
    )


def _choice(text: str, key: str, value: str, choices: Tuple[str, ...]) -> str:
    for choice in choices:
        if value.lower() == choice.lower():
            return choice
    raise _fail(text, f"{key} must be one of {', '.join(choices)}, got {value!r}")


def _flag(text: str, key: str, value: str) -> bool:
    if value.lower() in TRUE_WORDS:
        return True
    if value.lower() in FALSE_WORDS:
        return False
    raise _fail(text, f"{key} must be true or false, got {value!r}")


def _batch_range(text: str, value: str) -> Tuple[int, int]:
    parts = value.strip("[]()").split(",")
    try:
        start, end = (int(part) for part in parts)
    except ValueError:
        raise _fail(text, f"batch_range must be [start,end] integers, got {value!r}") from None
    if not 0 <= start < end:
        raise _fail(text, f"batch_range [start,end] needs 0 <= start < end, got {value!r}")
    return start, end


def _ranks(text: str, value: str) -> Optional[int]:
    if value.lower() == "all":
        return None
    if not value.isdigit():
        raise _fail(text, f"ranks must be a rank number (default 0) or all, got {value!r}")
    return int(value)


def parse_profiler_options(text: str) -> ProfilerOptions:
    """The options of ``text``; ``ConfigError`` naming the key and the accepted options for an
    unknown option, a pair without ``=`` or a bad value."""
    values = {}
    for pair in text.replace(" ", "").split(";"):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise _fail(text, f"{pair!r} is not key=value")
        if key not in OPTIONS:
            raise _fail(text, f"unknown option {key!r}")
        if key == "batch_range":
            values[key] = _batch_range(text, value)
        elif key == "state":
            values[key] = _choice(text, key, value, STATES)
        elif key == "sorted_key":
            values[key] = _choice(text, key, value, SORTED_KEYS)
        elif key == "tracer_option":
            values[key] = _choice(text, key, value, TRACER_OPTIONS)
        elif key in ("exit_on_finished", "timer_only"):
            values[key] = _flag(text, key, value)
        elif key == "ranks":
            values[key] = _ranks(text, value)
        else:
            values[key] = value
    if not values:
        raise _fail(text, "no option given (null turns the profiler off)")
    return ProfilerOptions(**values)


def profiler_settings(glob: Mapping[str, Any]) -> Optional[ProfilerOptions]:
    """The parsed ``Global.profiler_options`` (None when unset or empty)."""
    text = glob.get("profiler_options")
    return parse_profiler_options(text) if text else None
