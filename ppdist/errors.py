"""Exceptions that carry a user-facing message (printed without a traceback by the tools)."""


class PPDistError(Exception):
    """Base class: the message alone tells the user what is wrong and where. ``exit_code``: the
    tools' exit status for it (2: a mistake in what the user gave, 1: a failure while running)."""

    exit_code = 1


class ConfigError(PPDistError):
    """A config file or override is invalid (unknown key/name, wrong type, missing key)."""

    exit_code = 2


class DataError(PPDistError):
    """Input data cannot be used (missing directory or label file, too many bad samples)."""


class CheckpointError(PPDistError):
    """A checkpoint is missing, unreadable or incompatible with the run."""


class EmptyEvaluationError(DataError):
    """An evaluation saw no sample (empty Eval set, or every sample bad): it has no score."""

    exit_code = 2


class TrackerError(PPDistError):
    """An experiment tracker the config asks for (MLflow, W&B) cannot start its run."""
