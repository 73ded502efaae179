"""Generate a synthetic dataset, e.g. ``python tools/make_synthetic_data.py rec --out DIR --num 12000``.

Tasks:
- ``rec``: text lines in PaddleOCR SimpleDataSet layout. The defaults render the quick start's
  data (3-7 characters of 0-9a-z); ``--num_val 600 --seed 0`` reproduce
  ``configs/rec/quickstart_synth.yml``'s set exactly.
- ``rec_ppocrv3``: the PP-OCRv3 quick start's lines (4-12 characters, some with a space) of the
  characters of PaddleOCR's ``ppocr_keys_v1.txt`` the DejaVu fonts draw, written to ``dict.txt``;
  ``--num 5000 --num_val 200 --seed 0`` reproduce ``configs/rec/PP-OCRv3/quickstart_synth.yml``'s set.
- ``seg``: shapes over textured backgrounds in PaddleSeg file-list layout (``images/``,
  ``labels/``, ``train.txt``, ``val.txt``, ``labels.txt``), e.g.
  ``python tools/make_synthetic_data.py seg --out DIR --num 2000 --num_classes 5``.
- ``det``: shapes over textured backgrounds in COCO layout (``images/{train,val}/``,
  ``annotations/instances_{train,val}.json`` with category ids 1, 3, 5, ..., ``train.txt``),
  e.g. ``python tools/make_synthetic_data.py det --out DIR --num 4000 --num_classes 4``.
- ``table``: tables (random rows/columns, a shaded header or not, short cell texts, all,
  horizontal or no ruling lines; row/col spans and empty cells in the ruled ones, where they can
  be seen) in PubTabNet's jsonl layout (``images/{train,val}/``,
  ``train.txt`` / ``val.txt`` with one json object per line), e.g.
  ``python tools/make_synthetic_data.py table --out DIR --num 2000 --max_rows 8 --max_cols 6``.

Skips generation when the output already holds a dataset (the summary's ``differs`` then lists the
settings it was drawn with that differ from the ones asked, from its ``synthetic_settings.json``);
prints a JSON summary.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ppdist.data.synthetic_io import SyntheticSettingError
from ppdist.data.synthetic_table import CELL_HEIGHT, CELL_WIDTH
from ppdist.registry import SYNTHETIC_DATA
from ppdist.utils import strict_json

COMMON_KEYS = ("out", "num", "num_val", "seed", "task")
OPTION_OF = {"num_train": "num"}  # a generator's keyword -> this tool's option


def _task_parser(tasks: argparse._SubParsersAction, name: str, help_text: str) -> argparse.ArgumentParser:
    """A sub-command with the options every generator takes."""
    sub = tasks.add_parser(name, help=help_text)
    sub.add_argument("--out", required=True, help="output directory (created atomically)")
    sub.add_argument("--num", type=int, required=True, help="number of training images")
    sub.add_argument(
        "--num_val", type=int, default=None, help="validation images (default: num // 10, at least 1)"
    )
    sub.add_argument("--seed", type=int, default=0)
    return sub


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    tasks = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    rec = _task_parser(tasks, "rec", "text-recognition lines in PaddleOCR SimpleDataSet layout")
    rec.add_argument("--min_len", type=int, default=3)
    rec.add_argument("--max_len", type=int, default=7)
    rec.add_argument("--charset", default="0123456789abcdefghijklmnopqrstuvwxyz")
    rec.add_argument(
        "--upper_case_ratio",
        type=float,
        default=0.0,
        help="fraction of letters rendered upper case (labels keep the case)",
    )
    ppocr = _task_parser(
        tasks, "rec_ppocrv3", "PP-OCRv3 quick-start lines (48x320 recipe) with their dictionary, dict.txt"
    )
    ppocr.add_argument("--min_len", type=int, default=4)
    ppocr.add_argument("--max_len", type=int, default=12)
    ppocr.add_argument(
        "--max_chars", type=int, default=None, help="keep the first N drawable characters (default: all)"
    )
    ppocr.add_argument("--space_ratio", type=float, default=0.2, help="share of lines with one space")
    ppocr.add_argument(
        "--source_dict", default=None, help="candidate characters (default: ppdist's ppocr_keys_v1.txt)"
    )
    seg = _task_parser(tasks, "seg", "semantic segmentation (shapes) in PaddleSeg file-list layout")
    seg.add_argument("--image_size", type=int, default=128, help="side of the square images in pixels")
    seg.add_argument("--num_classes", type=int, default=5, help="classes including background (2-8)")
    det = _task_parser(tasks, "det", "object detection (shapes) in COCO layout")
    det.add_argument("--image_size", type=int, default=160, help="side of the square images in pixels")
    det.add_argument("--num_classes", type=int, default=4, help="object classes (1-7)")
    table = _task_parser(tasks, "table", "table structure (rendered tables) in PubTabNet jsonl layout")
    table.add_argument("--max_rows", type=int, default=8, help="rows per table: 2 to this")
    table.add_argument("--max_cols", type=int, default=6, help="columns per table: 2 to this")
    table.add_argument(
        "--span_ratio", type=float, default=0.15, help="share of cells that try a row/col span"
    )
    for name, default, what in (
        ("cell_height", CELL_HEIGHT, "row heights"),
        ("cell_width", CELL_WIDTH, "column widths"),
    ):
        table.add_argument(
            f"--{name}",
            type=int,
            nargs=2,
            default=list(default),
            metavar=("LOW", "HIGH"),
            help=f"{what} in pixels, [LOW, HIGH) (default: {default[0]} {default[1]})",
        )
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    num_val = args.num_val if args.num_val is not None else max(1, args.num // 10)
    task_options = {k: v for k, v in vars(args).items() if k not in COMMON_KEYS}
    try:
        summary = SYNTHETIC_DATA.get(args.task)(
            args.out, num_train=args.num, num_val=num_val, seed=args.seed, **task_options
        )
    except SyntheticSettingError as exc:
        option = OPTION_OF.get(exc.key, exc.key)
        print(f"make_synthetic_data.py {args.task}: error: --{option} {exc.detail}", file=sys.stderr)
        sys.exit(2)
    print(strict_json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
