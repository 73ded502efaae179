"""Data at the seeds' scale: ``python tools/benchmark_data.py [--lines N ...] [--coco I:B:C ...]
[--eval I:B:C:D ...] [--workdir DIR] [--json OUT]``.

Makes synthetic index files (PaddleOCR label files of N lines; COCO json of I images, B boxes,
C classes; no images), then reports, each in a fresh process, the dataset build time and the
memory it adds with ``cache: off``, a cold cache (the node's first rank) and a warm one (the
other ranks, later runs, restarts); and the rank-0 time of a COCO evaluation of D detections
per image. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.benchmark.data_scale import format_tables, run
from ppdist.metrics.coco import BACKENDS
from ppdist.utils import strict_json
from ppdist.utils.atomic import write_text_atomic


def _sizes(text: str, parts: int) -> list:
    values = [int(float(v)) for v in text.split(":")]
    if len(values) != parts:
        raise argparse.ArgumentTypeError(f"expected {parts} numbers separated by ':', got {text!r}")
    return values


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=lambda v: int(float(v)), nargs="*", default=[2_000_000])
    parser.add_argument("--coco", type=lambda v: _sizes(v, 3), nargs="*", default=[[118_287, 860_001, 80]])
    parser.add_argument("--eval", type=lambda v: _sizes(v, 4), nargs="*", default=[[5_000, 36_781, 80, 100]])
    parser.add_argument("--backends", nargs="*", default=list(BACKENDS), help="COCOMetric backends to time")
    parser.add_argument(
        "--workdir", default="output/benchmark_data", help="where the synthetic files go (kept)"
    )
    parser.add_argument("--json", default=None, help="also write the measurements here")
    args = parser.parse_args(argv)
    report = run(args.workdir, args.lines, args.coco, args.eval, args.backends)
    print(format_tables(report))
    if args.json:
        write_text_atomic(args.json, strict_json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
