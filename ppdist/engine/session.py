"""A process's set-up for a command, in one place: its place in the run (``init_distributed``),
the run folder claimed when it writes one (before anything is written there), the ``ppdist``
logger, the CPU-fallback warning; and its end (the claim released, the process group left).
``tools/train.py``, ``tools/eval.py``, ``tools/benchmark.py`` and ``build_trainer`` open one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ppdist.engine.dist import DistEnv, cleanup, init_distributed, warn_cpu_fallback
from ppdist.engine.logger import LOGGER_NAME, setup_logger
from ppdist.engine.run_dir import RunDirClaim, claim_run_dir


@dataclass
class Session:
    """Where this process runs, its logger and (for a training run) its claim on the run folder."""

    env: DistEnv
    logger: logging.Logger
    claim: Optional[RunDirClaim] = None

    def close(self, finished: bool = False) -> None:
        """Release the run folder and leave the process group (``finished``: wait for the peers)."""
        if self.claim is not None:
            self.claim.release()
        cleanup(self.env, wait_for_peers=finished)


def open_session(
    config: Mapping[str, Any],
    doing: str,
    log_file: Optional[str] = None,
    claim: bool = False,
    env: Optional[DistEnv] = None,
    keep_logger: bool = False,
) -> Session:
    """Join the run (``env`` when the caller has joined it already), claim ``save_model_dir`` when
    ``claim`` (before the log file: ``Global.overwrite`` starts it afresh), log to the console and
    ``log_file`` (``keep_logger``: leave a configured ``ppdist`` logger as it is) and warn once
    when ``doing`` falls back to the CPU (the session that joined the run warns)."""
    glob = config["Global"]
    joined = env is None
    env = env or init_distributed(glob["use_gpu"], glob["dist_timeout"])
    run_claim = claim_run_dir(config, env) if claim else None
    logger = logging.getLogger(LOGGER_NAME)
    if not (keep_logger and logger.handlers):
        logger = setup_logger(log_file, env.rank)
    if run_claim is not None:
        run_claim.report()  # a stale lock taken over, what Global.overwrite removed
    if joined:
        warn_cpu_fallback(env, doing)
    return Session(env, logger, run_claim)
