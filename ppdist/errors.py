"""Exceptions that carry a user-facing message (printed without a traceback by the tools)."""

from typing import TypeVar


class PPDistError(Exception):
    """Base class: the message alone tells the user what is wrong and where. ``exit_code``: the
    tools' exit status for it (2: a mistake in what the user gave, 1: a failure while running).
    ``shared``: every process raises the same error (a collective decision), so rank 0 alone
    reports it."""

    exit_code = 1
    shared = False


class ConfigError(PPDistError):
    """A config file or override is invalid (unknown key/name, wrong type, missing key)."""

    exit_code = 2
    shared = True


class DataError(PPDistError):
    """Input data cannot be used (missing directory or label file, too many bad samples)."""


class DataPathError(DataError):
    """A data path the config names (directory, label file, annotation file) does not exist: an
    input mistake."""

    exit_code = 2


class CheckpointError(PPDistError):
    """A checkpoint is missing, unreadable or incompatible with the run."""


class CheckpointPathError(CheckpointError):
    """The checkpoint given is not there, is a directory, is empty or is not a checkpoint at all:
    an input mistake."""

    exit_code = 2


class EmptyEvaluationError(DataError):
    """An evaluation saw no sample (empty Eval set, or every sample bad): it has no score."""

    exit_code = 2


class OutputPathError(PPDistError):
    """An output path given to a tool (``--out``, ``--output_dir``) is a file where a folder is
    expected (or the reverse) or cannot be written: an input mistake, found before the work."""

    exit_code = 2
    shared = True  # every process checks the same path


class TrackerError(PPDistError):
    """An experiment tracker the config asks for (MLflow, W&B) cannot start its run."""


E = TypeVar("E", bound=PPDistError)


def shared(error: E) -> E:
    """``error`` marked as raised alike by every process (after a collective decision, or on the
    same broadcast state): the tools print it on rank 0 only."""
    error.shared = True
    return error
