"""Generate a config's synthetic data set the first time it is needed (``Global.synthetic_data``)."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from ppdist.config import synthetic_generator
from ppdist.data.synthetic_io import SyntheticSettingError
from ppdist.engine.dist import DistEnv, barrier
from ppdist.errors import ConfigError

logger = logging.getLogger("ppdist")


def describe_synthetic_data(summary: Mapping[str, Any]) -> str:
    """One readable line for a generator's summary: what the set holds and whether it was drawn."""
    parts = [f"{summary.get('task', 'data')} set in {summary.get('out_dir', '?')}"]
    counts = f"{summary.get('num_train', '?')} train / {summary.get('num_val', '?')} val samples"
    if "image_size" in summary:
        size = summary["image_size"]
        counts += f" of {'x'.join(map(str, size)) if isinstance(size, (list, tuple)) else size} px"
    parts.append(counts)
    if summary.get("class_names"):
        parts.append(f"{len(summary['class_names'])} classes ({', '.join(map(str, summary['class_names']))})")
    elif summary.get("num_classes"):
        parts.append(f"{summary['num_classes']} classes")
    if summary.get("skipped"):
        parts.append("already there, used as is")
    elif summary.get("seconds") is not None:
        parts.append(f"drawn in {summary['seconds']:.1f} s (seed {summary.get('seed', '?')})")
    return ", ".join(parts)


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
        try:
            summary = generator(out_dir, **kwargs)
        except SyntheticSettingError as exc:
            raise ConfigError(f"Global.synthetic_data.{exc.key} {exc.detail}") from None
        logger.info("synthetic data: %s", describe_synthetic_data(summary))
        differs = summary.get("differs") or {}
        if differs:
            logger.warning(
                "%s already holds a data set drawn with %s; it is used as is (delete the folder to "
                "generate the requested one)",
                out_dir,
                ", ".join(f"{k}={v['found']} (config asks {v['asked']})" for k, v in differs.items()),
            )
    barrier(env)
