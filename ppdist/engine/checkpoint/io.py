"""Checkpoint files: where they are, writing them atomically, reading them safely, and finding the
newest copy among the processes of a job.

A checkpoint is one ``<name>.pt`` file written by global rank 0 through a unique temporary file
beside it and ``os.replace``, so a kill at any moment leaves either the old or the new file. Files
are read with ``torch.load(weights_only=True)``: only tensors and plain Python containers; a
Paddle weights file is read by the restricted unpickler of ``ppdist.convert.weights.pdparams``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from ppdist.convert.weights.pdparams import is_paddle_weights, load_pdparams
from ppdist.engine.dist import DistEnv, all_gather_object, broadcast_object
from ppdist.errors import CheckpointError, CheckpointPathError, shared
from ppdist.utils.atomic import torch_save_atomic

logger = logging.getLogger("ppdist")
SUFFIX = ".pt"
PADDLE_SUFFIX = ".pdparams"
PADDLE_KEY = "paddle_state_dict"  # load_file's wrapper of a Paddle file's arrays


def checkpoint_path(prefix_or_path: str) -> str:
    """``output/x/best_accuracy`` or ``.../best_accuracy.pt`` -> the existing ``.pt`` path; a Paddle
    prefix (``.../best_accuracy`` with ``best_accuracy.pdparams`` beside it) -> the ``.pdparams``."""
    if prefix_or_path.endswith(SUFFIX) or is_paddle_weights(prefix_or_path):
        candidates = [prefix_or_path]
    else:
        candidates = [prefix_or_path + SUFFIX, prefix_or_path, prefix_or_path + PADDLE_SUFFIX]
    for path in candidates:
        if os.path.isfile(path):
            return path
    if os.path.isdir(prefix_or_path):
        raise CheckpointPathError(
            f"{prefix_or_path} is a directory, not a checkpoint: give the file, e.g. "
            f"{os.path.join(prefix_or_path, 'latest')} (its .pt is found)"
        )
    raise CheckpointPathError(f"checkpoint not found: {prefix_or_path} (looked for {', '.join(candidates)})")


def save_atomic(obj: Mapping[str, Any], path: str) -> None:
    """``torch.save`` to a temporary file beside ``path``, flush to disk, then atomically replace
    ``path``. A failed write (disk full, read-only folder, a file where the folder should be) is a
    ``CheckpointError`` saying what and where; the partial file is removed and ``path`` is kept."""
    try:
        torch_save_atomic(dict(obj), path)
    except (OSError, RuntimeError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        if isinstance(exc, RuntimeError):  # torch's writer: "... unexpected pos N vs M" when the disk fills
            reason = f"the write stopped (is the disk full?): {reason}"
        kept = "the previous one is kept" if os.path.exists(path) else "nothing was written"
        raise CheckpointError(f"cannot write checkpoint {path}: {reason}; {kept}") from None


def load_file(path: str) -> Dict[str, Any]:
    """Load a checkpoint or state dict safely (``weights_only=True``) onto the CPU.

    A Paddle weights file (``.pdparams`` / ``.pdema``) is read without running code and returned
    as ``{PADDLE_KEY: {paddle name: array}}``; ``weights_for`` converts it for a given model.
    """
    if is_paddle_weights(path):
        return {PADDLE_KEY: load_pdparams(path)}
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise CheckpointPathError(f"cannot load {path}: the file is empty (0 bytes; an interrupted copy?)")
    if not looks_like_torch_file(path):
        raise CheckpointPathError(
            f"{path} is not a checkpoint (not a file written by torch.save, e.g. a config or an image): "
            "give a .pt checkpoint such as output/x/best_accuracy"
        )
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        first_line = (str(exc).splitlines() or ["no message"])[0]
        raise CheckpointError(f"cannot load {path}: {type(exc).__name__}: {first_line}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a dict (got {type(data).__name__})")
    return data


def looks_like_torch_file(path: str) -> bool:
    """Whether ``path`` starts like a ``torch.save`` file: a zip archive (``PK``) or a pickle
    (protocol byte ``0x80``); unreadable files pass, their error comes from ``torch.load``."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(2)
    except OSError:
        return True
    return head.startswith(b"PK") or head[:1] == b"\x80"


def saved_global_step(state: Mapping[str, Any]) -> int:
    """The global step a checkpoint was written at (-1 for weights only), in today's layout or
    in that of ppdist 0.1 (position at the top level)."""
    return int((state.get("position") or state).get("global_step", -1))


def _shared_error(message: str, exit_code: int) -> CheckpointError:
    """The error every process raises alike after ``load_across_ranks``' collective decision."""
    kind = CheckpointPathError if exit_code == CheckpointPathError.exit_code else CheckpointError
    return shared(kind(message))


def load_across_ranks(
    path: str, env: DistEnv, missing_ok: bool = False
) -> Optional[Tuple[Dict[str, Any], str]]:
    """``(state, source)`` of ``path`` on every process, whichever of them have the file.

    Checkpoints are written to global rank 0's disk only, and after a restart rank 0 may sit on
    another node (c10d rendezvous), so without a shared filesystem some processes have no copy or
    an older one. Every process reads its own; the newest (highest ``global_step``) wins and is
    broadcast to the processes that lack it. All processes take the same decision: the same
    error, or None when no process has the file and ``missing_ok``.
    """
    state: Optional[Dict[str, Any]] = None
    missing = error = None  # (message, the error's exit code)
    try:
        resolved = checkpoint_path(path)
    except CheckpointError as exc:
        missing = (str(exc), exc.exit_code)
    else:
        try:
            state = load_file(resolved)
        except CheckpointError as exc:
            error = (str(exc), exc.exit_code)
    step = saved_global_step(state) if state is not None else None
    views = all_gather_object((step, error, missing), env)
    errors = [(rank, view[1]) for rank, view in enumerate(views) if view[1]]
    if errors:
        rank, (message, code) = errors[0]
        raise _shared_error(message if not env.distributed else f"rank {rank}: {message}", code)
    steps = [view[0] for view in views]
    if all(s is None for s in steps):
        if missing_ok:
            return None
        raise _shared_error(*views[0][2])
    newest = max(s for s in steps if s is not None)
    if all(s == newest for s in steps):
        return state, path
    source_rank = steps.index(newest)
    received = broadcast_object(state if env.rank == source_rank else None, env, src=source_rank)
    logger.info(
        "checkpoint %s (global_step %d) found on %d of %d processes; sent from rank %d to the others",
        path,
        newest,
        sum(s == newest for s in steps),
        env.world_size,
        source_rank,
    )
    return received, f"{path} (from rank {source_rank})"


# --------------------------------------------------------------------------- weights
