"""Generate a config's synthetic data set the first time it is needed (``Global.synthetic_data``)."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from ppdist.config import synthetic_generator
from ppdist.engine.dist import DistEnv, barrier

logger = logging.getLogger("ppdist")


def ensure_synthetic_data(config: Mapping[str, Any], env: DistEnv) -> None:
    """Local rank 0 of each node generates the data set if absent; the other ranks wait."""
    spec = config["Global"].get("synthetic_data")
    if not spec:
        return
    generator = synthetic_generator(spec)
    out_dir = spec["data_dir"]
    kwargs = {k: v for k, v in spec.items() if k not in ("kind", "data_dir")}
    if env.local_rank == 0:
        if not os.path.isfile(os.path.join(out_dir, "train.txt")):
            logger.info("generating the synthetic %s data set in %s ...", spec["kind"], out_dir)
        summary = generator(out_dir, **kwargs)
        logger.info("synthetic data: %s", summary)
        differs = [k for k in ("num_train", "num_val") if k in kwargs and summary.get(k) != kwargs[k]]
        if summary.get("skipped") and differs:
            logger.warning(
                "%s already holds a data set with %s; it is used as is (delete the folder to "
                "generate the requested one)",
                out_dir,
                ", ".join(f"{k}={summary[k]} (config asks {kwargs[k]})" for k in differs),
            )
    barrier(env)
