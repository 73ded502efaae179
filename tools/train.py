"""Train a model: ``python tools/train.py -c CFG [-o Key.sub=value ...]`` (also under torchrun)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.cli import base_parser, flat_overrides, run_main
from ppdist.convert.configs import conversion_of, load_config, report_conversion
from ppdist.data.prepare import ensure_synthetic_data
from ppdist.engine.dist import cleanup, init_distributed
from ppdist.engine.logger import setup_logger
from ppdist.engine.run_dir import claim_run_dir
from ppdist.engine.setup import build_trainer
from ppdist.errors import ConfigError


def main() -> int:
    args = base_parser(__doc__).parse_args()
    config = load_config(args.config, flat_overrides(args.opt))  # validated before anything runs
    conversion = conversion_of(
        args.config
    )  # a PaddleDetection/PaddleSeg config, converted on load; else None
    if not config.get("Train"):
        raise ConfigError(f"{args.config}: missing required section Train")
    glob = config["Global"]
    env = init_distributed(glob["use_gpu"], glob["dist_timeout"])
    lock = claim_run_dir(config, env)  # one run per folder, before anything is written there
    logger = setup_logger(os.path.join(glob["save_model_dir"], "train.log"), env.rank)
    report_conversion(conversion, glob["save_model_dir"], logger, env.rank == 0)  # converted_config.yml
    if args.profiler_options:
        logger.warning("-p/--profiler_options is ignored; use tools/benchmark.py")
    try:
        ensure_synthetic_data(config, env)
        build_trainer(config, env).train()
    finally:
        if lock is not None:
            lock.release()
        cleanup(env)
    return 0


if __name__ == "__main__":
    run_main(main)
