"""Output paths checked before the work: a tool refuses an ``--out``/``--output_dir`` it could not
write in one line (``OutputPathError``, exit 2) instead of failing with a traceback at the end."""

from __future__ import annotations

import os

from ppdist.errors import OutputPathError


def _nearest_existing(path: str) -> str:
    """``path`` or its closest ancestor that exists."""
    current = os.path.abspath(path)
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _check_creatable(folder: str, path: str, what: str) -> None:
    """``folder`` (``path`` itself or the folder of the file ``path``) may not exist: its nearest
    existing ancestor must be a writable folder."""
    base = _nearest_existing(folder)
    if not os.path.isdir(base):
        raise OutputPathError(f"{what} {path}: cannot be created: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputPathError(f"{what} {path}: cannot be created: {base} is not writable")


def check_output_dir(path: str, what: str) -> None:
    """Refuse ``path`` as an output folder when it is a file or cannot be written or created."""
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputPathError(f"{what} {path}: the folder is not writable")
        return
    if os.path.lexists(path):
        raise OutputPathError(f"{what} {path}: is a file, not a folder; give a folder")
    _check_creatable(path, path, what)


def check_output_file(path: str, what: str) -> None:
    """Refuse ``path`` as an output file when it is a folder or cannot be written or created."""
    if os.path.isdir(path):
        raise OutputPathError(f"{what} {path}: is a folder; give a file name")
    if os.path.exists(path):
        if not os.access(path, os.W_OK) or not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
            raise OutputPathError(f"{what} {path}: not writable")
        return
    _check_creatable(os.path.dirname(os.path.abspath(path)), path, what)
