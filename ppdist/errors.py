"""Exceptions that carry a user-facing message (printed without a traceback by the tools)."""


class PPDistError(Exception):
    """Base class: the message alone tells the user what is wrong and where."""


class ConfigError(PPDistError):
    """A config file or override is invalid (unknown key/name, wrong type, missing key)."""


class DataError(PPDistError):
    """Input data cannot be used (missing directory or label file, too many bad samples)."""


class CheckpointError(PPDistError):
    """A checkpoint is missing, unreadable or incompatible with the run."""
