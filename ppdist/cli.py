"""Shared command-line handling of the tools: ``-c``/``-o`` parsing and clean error exits."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any, Callable, List, Sequence

from ppdist.engine.dist import peer_failure_message
from ppdist.errors import ConfigError, PPDistError
from ppdist.utils.memory import keep_freed_memory

EXIT_CONFIG_ERROR = 2
EXIT_RUNTIME_ERROR = 1


def base_parser(description: str, config_required: bool = True) -> argparse.ArgumentParser:
    """``-c CFG [-o Key.sub=value ...]`` as in PaddleOCR's tools (tools/train.py adds ``-p``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-c", "--config", required=config_required, help="YAML config file")
    parser.add_argument(
        "-o",
        "--opt",
        nargs="+",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override config values, e.g. -o Global.epoch_num=10 Train.loader.num_workers=0",
    )
    return parser


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (a batch size, a count)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def flat_overrides(groups: Sequence[Sequence[str]]) -> List[str]:
    return [item for group in groups for item in group]


def _launch_rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) or 0)


def error_message(exc: BaseException) -> str:
    """The message of ``exc``; for an error re-raised from a DataLoader worker (whose text
    embeds the worker's traceback) only the original message, not the stack."""
    text = str(exc)
    if "\nOriginal Traceback" not in text:
        return text
    marker = f"{type(exc).__module__}.{type(exc).__name__}: "
    position = text.rfind(marker)
    return text[position + len(marker) :].strip() if position >= 0 else text.strip().splitlines()[-1]


def merge_stderr_into_stdout() -> None:
    """Point file descriptor 2 at stdout's file, so that a worker started by ``ppdist.launch --log_dir``
    (which sets ``PPDIST_STDERR_TO_STDOUT=1``) has everything it prints in its workerlog, in order."""
    try:
        sys.stderr.flush()
        sys.stdout.flush()
        os.dup2(sys.stdout.fileno(), sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # streams without a file descriptor (e.g. captured)
        return
    reconfigure = getattr(sys.stderr, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(line_buffering=True)


def log_to_files(message: str) -> None:
    """``message`` as an ERROR line in the log files of the ``ppdist`` logger (``train.log``), not on
    the console: the tools print it once themselves."""
    logger = logging.getLogger("ppdist")
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, "%s", (message,), None)
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def report_error(message: str, shared: bool, prefix: str = "error") -> None:
    """Print ``ppdist: <prefix>: message`` once: on rank 0, or on the rank that alone failed. A rank
    other than 0 of an error every rank raised alike prints one line saying that it stopped."""
    rank = _launch_rank()
    if shared and rank != 0:
        print(f"ppdist: rank {rank} stopped: rank 0 reports the error", file=sys.stderr, flush=True)
        time.sleep(3)  # let rank 0 report it before torchrun stops the group
        return
    log_to_files(message)
    where = f"rank {rank}: " if rank != 0 else ""
    print(f"ppdist: {where}{prefix}: {message}", file=sys.stderr)


def run_main(main: Callable[[], Any]) -> None:
    """Run ``main``; a ``PPDistError`` becomes one message on stderr and an exit code, no traceback.
    The tools' processes train, evaluate and predict batch after batch: glibc keeps the memory each
    batch frees for the next (``keep_freed_memory``)."""
    if os.environ.get("PPDIST_STDERR_TO_STDOUT") == "1":
        merge_stderr_into_stdout()
    keep_freed_memory()
    try:
        result = main()
    except ConfigError as exc:
        report_error(error_message(exc), shared=True, prefix="config error")
        sys.exit(EXIT_CONFIG_ERROR)
    except PPDistError as exc:
        report_error(error_message(exc), shared=exc.shared)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("ppdist: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # a peer that died or hung surfaces here as a torch.distributed error
        message = peer_failure_message(exc)
        if message is None:
            raise
        log_to_files(message)
        print(f"ppdist: error: {message}", file=sys.stderr)
        sys.exit(EXIT_RUNTIME_ERROR)
    sys.exit(result if isinstance(result, int) else 0)
