"""Look at what the model sees: ``python tools/browse_dataset.py -c CFG [-o Key=val ...] [--split Train|Eval]
--num N --out DIR [--shuffle --seed S] [--all]``.

Writes ``DIR/samples.png`` (the first N samples, or a seeded random N, after the config's transforms,
with their boxes and class names, label overlays or text labels) and ``DIR/summary.json`` (image sizes,
class histogram, boxes per image, label lengths, bad samples; of the N samples, or of the whole split
with ``--all``), and prints the summary. Synthetic quick-start data is generated first if absent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.cli import flat_overrides, run_main
from ppdist.convert.configs import load_config
from ppdist.data.prepare import ensure_synthetic_data
from ppdist.engine.dist import DistEnv
from ppdist.errors import ConfigError
from ppdist.utils.atomic import write_text_atomic
from ppdist.visualize.dataset_browser import (
    choose_indices,
    draw_samples,
    read_samples,
    split_dataset,
    summarize,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-c", "--config", required=True, help="YAML config (any suite ppdist loads)")
    parser.add_argument("-o", "--opt", nargs="+", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--split", choices=("Train", "Eval"), default="Train")
    parser.add_argument("--num", type=int, default=16, help="samples to draw (default: %(default)s)")
    parser.add_argument("--out", default="browse", help="output folder (default: %(default)s)")
    parser.add_argument(
        "--shuffle", action="store_true", help="a seeded random choice instead of the first N"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--all", action="store_true", help="summarize the whole split (draw N)")
    args = parser.parse_args()
    config = load_config(args.config, flat_overrides(args.opt))
    if not config.get(args.split):
        raise ConfigError(f"{args.config} has no {args.split} section")
    if args.num <= 0:
        raise ConfigError(f"--num must be a positive number of samples, got {args.num}")
    ensure_synthetic_data(config, DistEnv())
    dataset = split_dataset(config, args.split)
    indices = choose_indices(len(dataset), args.num, args.shuffle, args.seed)
    drawn = read_samples(config, args.split, dataset, indices)
    os.makedirs(args.out, exist_ok=True)
    ignore_index = getattr(dataset, "ignore_index", 255)
    draw_samples(drawn, os.path.join(args.out, "samples.png"), ignore_index)
    counted = read_samples(config, args.split, dataset, range(len(dataset))) if args.all else drawn
    summary = dict(
        summarize(counted), of="the whole split" if args.all else f"the {len(indices)} drawn samples"
    )
    write_text_atomic(os.path.join(args.out, "summary.json"), json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {os.path.join(args.out, 'samples.png')} and summary.json")
    return 0


if __name__ == "__main__":
    run_main(main)
