"""Generate a config's synthetic data set the first time it is needed (``Global.synthetic_data``)."""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Mapping

from ppdist.engine.dist import DistEnv, barrier
from ppdist.errors import ConfigError
from ppdist.registry import did_you_mean

logger = logging.getLogger("ppdist")


def _generator(spec: Mapping[str, Any]) -> Any:
    from ppdist.data.synthetic import GENERATORS

    kind = spec.get("kind")
    if kind not in GENERATORS:
        raise ConfigError(f"Global.synthetic_data.kind must be one of {sorted(GENERATORS)}, got {kind!r}")
    return GENERATORS[kind]


def validate_synthetic_spec(spec: Mapping[str, Any]) -> None:
    """Check ``{kind, data_dir, ...generator keywords}`` against the generator's signature."""
    generator = _generator(spec)
    if not spec.get("data_dir"):
        raise ConfigError("missing required key Global.synthetic_data.data_dir")
    params = inspect.signature(generator).parameters
    for key in spec:
        if key in ("kind", "data_dir"):
            continue
        if key not in params or key == "out_dir":
            raise ConfigError(
                f"unknown key Global.synthetic_data.{key}."
                f"{did_you_mean(key, [p for p in params if p != 'out_dir'])}"
            )


def ensure_synthetic_data(config: Mapping[str, Any], env: DistEnv) -> None:
    """Local rank 0 of each node generates the data set if absent; the other ranks wait."""
    spec = config["Global"].get("synthetic_data")
    if not spec:
        return
    generator = _generator(spec)
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
