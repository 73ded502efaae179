"""Look at what the model sees: ``python tools/browse_dataset.py -c CFG [-o Key=val ...]
[--split Train|Eval] [--num N] [--out DIR] [--shuffle --seed S] [--all]``.

Writes ``DIR/samples.png`` (pages ``samples_1.png`` ... for many samples): the first N samples,
or a seeded random N, after the config's transforms and batch transforms, with their boxes and
class names, label overlays or decoded text labels; and ``DIR/summary.json`` / ``summary.md``
(printed): image sizes, class histogram, boxes per image, label lengths, bad samples — of the N
samples, or of the whole split with ``--all``. Synthetic quick-start data is generated if absent.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.browse.browse import BrowseOptions, NothingToDraw, browse_dataset, check_options
from ppdist.browse.dataset_browser import summary_markdown
from ppdist.cli import flat_overrides, run_main
from ppdist.convert.configs import load_config
from ppdist.engine.dist import DistEnv
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.utils.writable import check_output_dir


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-c", "--config", required=True, help="YAML config (any suite ppdist loads)")
    parser.add_argument("-o", "--opt", nargs="+", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--split", choices=("Train", "Eval"), default="Train")
    parser.add_argument("--num", type=int, default=16, help="samples to draw (default: %(default)s)")
    parser.add_argument("--out", default="browse", help="output folder (default: %(default)s)")
    parser.add_argument(
        "--shuffle", action="store_true", help="a seeded random choice instead of the first N"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of --shuffle's choice (default: %(default)s)"
    )
    parser.add_argument("--all", action="store_true", help="summarize the whole split (still draws N)")
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    started = time.perf_counter()
    config = load_config(args.config, flat_overrides(args.opt))
    check_output_dir(args.out, "--out")
    options = BrowseOptions(args.split, args.num, args.out, args.shuffle, args.seed, args.all)
    check_options(config, options)  # before any data is generated
    ensure_synthetic_data(config, DistEnv())
    try:
        summary = browse_dataset(config, options)
    except NothingToDraw as exc:  # each bad sample (file:line, reason), then run_main's one-line error
        for line in exc.bad:
            print(f"bad sample: {line}")
        raise
    print(summary_markdown(summary))
    print(
        f"wrote {', '.join(summary['pictures'])} and summary.json / summary.md in {args.out} "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    run_main(main)
