"""Plot training curves: ``python tools/plot_logs.py RUN_DIR [OTHER_RUN_DIR ...] [--keys loss,lr,acc] --out curves.png``.

Reads each run's ``train.log`` (or, with ``--source tensorboard`` or without a log, its TensorBoard
events) and draws the loss terms, the learning rate and the main evaluation metrics against global step,
the runs overlaid (ppdist.visualize).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.cli import run_main
from ppdist.errors import ConfigError
from ppdist.utils.writable import check_output_file
from ppdist.visualize import draw_curves, read_run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", help="save_model_dir of each run to draw")
    parser.add_argument(
        "--keys",
        default="",
        help="comma-separated names, e.g. loss,lr,acc or ap_small (default: the losses, lr and the main metrics)",
    )
    parser.add_argument("--source", choices=("auto", "log", "tensorboard"), default="auto")
    parser.add_argument("--out", default="curves.png", help="PNG to write (default: %(default)s)")
    args = parser.parse_args()
    check_output_file(args.out, "--out")
    runs = {}
    for run_dir in args.runs:
        label = os.path.basename(os.path.normpath(run_dir))
        while label in runs:  # two folders of the same name
            label += "'"
        try:
            runs[label] = read_run(run_dir, args.source)
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
    keys = [k.strip() for k in args.keys.split(",") if k.strip()]
    try:
        drawn = draw_curves(runs, args.out, keys or None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print(f"wrote {args.out}: {', '.join(drawn)} of {len(runs)} run(s)")
    return 0


if __name__ == "__main__":
    run_main(main)
