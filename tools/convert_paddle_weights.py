"""Convert a Paddle weights file for a ppdist model: ``python tools/convert_paddle_weights.py
-c CFG --pdparams model.pdparams --out model.pt [--stage backbone] [--strict | --allow_partial]
[-o Key=value ...]``.

The file is read without Paddle and without running code (a restricted unpickler), each tensor
of the config's model is taken from its Paddle name and layout, and ``--out`` is written as a
ppdist weights file usable as ``Global.pretrained_model`` / ``Global.checkpoints`` for
tools/eval.py, export_model.py and infer.py. The report lists tensors skipped for a shape
mismatch (e.g. another class count), missing from the file, or in the file but unused. Under 90%
of the model's tensors converted, nothing is written unless ``--allow_partial``.
PaddleDetection keeps EMA weights in ``.pdparams`` and the raw ones in ``.pdema``: either converts.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.cli import base_parser, flat_overrides, run_main
from ppdist.components import build_model
from ppdist.convert.configs import load_config
from ppdist.engine.checkpoint import write_converted
from ppdist.errors import CheckpointError

MIN_SHARE = 0.9  # below this share of the model's tensors converted, --out is refused unless --allow_partial


def main() -> int:
    parser = base_parser(__doc__)
    parser.add_argument("--pdparams", required=True, help="Paddle weights: .pdparams or .pdema (or a prefix)")
    parser.add_argument("--out", required=True, help="ppdist weights file to write (.pt)")
    parser.add_argument(
        "--stage",
        choices=("backbone",),
        default=None,
        help="convert only this stage (e.g. ImageNet backbone weights, for Architecture.Backbone.pretrained)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail unless every tensor of the model is converted (evaluating a trained model)",
    )
    parser.add_argument(
        "--allow_partial",
        action="store_true",
        help=f"write --out even when under {MIN_SHARE:.0%} of the model's tensors convert (refused by "
        "default: the weights are probably of another model or config)",
    )
    args = parser.parse_args()
    config = load_config(args.config, flat_overrides(args.opt))
    min_share = 0.0 if args.allow_partial or args.strict else MIN_SHARE  # --strict: its own check below
    report = write_converted(build_model(config), args.pdparams, args.out, args.stage, min_share)
    print("\n".join(report.lines(limit=1000)))
    if args.strict and not report.complete:
        raise CheckpointError(
            f"{args.pdparams}: {len(report.skipped)} tensor(s) skipped and {len(report.missing)} "
            f"missing (--strict); {args.out} was written with the rest"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_main(main)
