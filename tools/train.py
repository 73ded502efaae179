"""Train a model: ``python tools/train.py -c CFG [-o Key.sub=value ...]`` (also under torchrun).

Also takes PaddleDetection's and PaddleSeg's tools/train.py flags (``--eval``, ``-r``, ``--amp``,
``--config``, ``--iters``, ``--do_eval``, ``--opts``, ...), with their suites' meaning.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.cli import run_main
from ppdist.cli_compat import parse_train_args, train_command
from ppdist.convert.configs import report_conversion
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.engine.session import open_session
from ppdist.engine.setup import build_trainer
from ppdist.errors import ConfigError


def main() -> int:
    args = parse_train_args(__doc__)
    command = train_command(args)  # validated before anything runs; Paddle configs converted
    config, conversion = command.config, command.conversion
    if not config.get("Train"):
        raise ConfigError(f"{args.config}: missing required section Train")
    glob = config["Global"]
    # one run per folder, claimed before anything is written there
    session = open_session(config, "training", os.path.join(glob["save_model_dir"], "train.log"), claim=True)
    env, logger = session.env, session.logger
    report_conversion(conversion, glob["save_model_dir"], logger, env.rank == 0)  # converted_config.yml
    for note in command.notes:
        logger.warning("%s", note)
    finished = False
    try:
        ensure_synthetic_data(config, env)
        build_trainer(config, env).train()
        finished = True
    finally:
        session.close(finished)
    return 0


if __name__ == "__main__":
    run_main(main)
