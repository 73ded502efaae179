"""Evaluate a checkpoint: ``python tools/eval.py -c CFG -o Global.checkpoints=PATH [--output_json F]
[--output_dir DIR [--iou 0.5 --score 0.25]] [--classwise]
[--aug_eval --scales 0.75 1.0 --flip_horizontal] [--is_slide --crop_size W H --stride W H]``.

Runs on all processes under torchrun (exact, unpadded shards) and prints the metrics.
"""

from __future__ import annotations

import functools
import logging
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.cli import base_parser, flat_overrides, run_main
from ppdist.cli_seg_eval import add_seg_eval_arguments, override_items, seg_eval_overrides
from ppdist.convert.configs import conversion_of, load_config, report_conversion
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.engine.session import open_session
from ppdist.errors import ConfigError, OutputPathError
from ppdist.eval_runner import evaluate_checkpoint, set_picture_options
from ppdist.utils import strict_json
from ppdist.utils.atomic import write_text_atomic
from ppdist.utils.writable import check_output_dir, check_output_file


def print_metrics(metrics: dict, env) -> None:
    """The metrics, one ``metric KEY: VALUE`` line each, on rank 0 (before anything is written)."""
    if env.is_main:
        for key, value in metrics.items():
            logging.getLogger("ppdist").info("metric %s: %s", key, value)


def main() -> int:
    parser = base_parser(__doc__)
    parser.add_argument("--output_json", default=None, help="write the metrics to this JSON file")
    parser.add_argument(
        "--output_dir",
        default=None,
        help="pictures of the evaluation (detection: PR curves, confusion matrix, per-class AP table and "
        "bbox.json; segmentation: confusion matrix, per-class IoU; recognition: the worst mistakes and their "
        "list, character confusions; table: the worst tables with predicted and labelled cells, accuracy by "
        "structure length)",
    )
    parser.add_argument(
        "--iou",
        type=float,
        default=None,
        help="detection confusion matrix of --output_dir: the IoU a prediction needs to match a ground-truth "
        "box (default Metric.confusion_iou, 0.5)",
    )
    parser.add_argument(
        "--score",
        type=float,
        default=None,
        help="detection confusion matrix of --output_dir: the score a prediction needs to be counted "
        "(default Metric.confusion_score, 0.25)",
    )
    parser.add_argument(
        "--classwise", action="store_true", help="per-class AP (detection); = -o Metric.classwise=true"
    )
    add_seg_eval_arguments(parser)
    args = parser.parse_args()
    extra = ["Metric.classwise=true"] if args.classwise else []
    extra += override_items(seg_eval_overrides(args))  # PaddleSeg val.py's flags: after -o, as it merges them
    if args.output_json:
        check_output_file(args.output_json, "--output_json")
    if args.output_dir:
        check_output_dir(args.output_dir, "--output_dir")
    config = load_config(args.config, flat_overrides(args.opt) + extra)
    try:
        set_picture_options(config, args.output_dir, args.iou, args.score)
    except ConfigError as exc:
        parser.error(str(exc))
    session = open_session(config, "evaluating")
    env, logger = session.env, session.logger
    report_conversion(
        conversion_of(args.config), None, logger, env.rank == 0
    )  # Paddle config: what was not converted
    try:
        ensure_synthetic_data(config, env)
        metrics = evaluate_checkpoint(config, env, args.output_dir, functools.partial(print_metrics, env=env))
    finally:
        session.close()
    if env.is_main:
        if args.output_json:
            try:
                write_text_atomic(args.output_json, strict_json.dumps(metrics, indent=2))
            except OSError as exc:  # the metrics are printed above
                raise OutputPathError(f"--output_json {args.output_json}: cannot write it: {exc}") from None
            logger.info("metrics written to %s", args.output_json)
    return 0


if __name__ == "__main__":
    run_main(main)
