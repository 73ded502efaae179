"""Convert a PaddleDetection / PaddleSeg / PaddleOCR config to a ppdist config:
``python tools/convert_paddle_config.py -c PADDLE.yml [--out OUT.yml] [-o Key.sub=value ...]``.

The suite is detected from the file; ``_BASE_`` / ``_base_`` inheritance is resolved with that
suite's rules. ``-o`` overrides apply to the converted ppdist config (ppdist key paths, as in the other tools).
The ppdist YAML goes to OUT.yml (or stdout); every key with no ppdist equivalent
is listed on stderr and in the YAML's comment header. Bad input exits with status 2 and one line.
"""

from __future__ import annotations

import copy
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from ppdist.cli import base_parser, flat_overrides, run_main
from ppdist.config import apply_overrides, validate
from ppdist.convert.configs import convert_config
from ppdist.errors import ConfigError


def main() -> int:
    parser = base_parser(__doc__)
    parser.add_argument(
        "--out", dest="output", default=None, help="where to write the ppdist config (default: stdout)"
    )
    args = parser.parse_args()
    conversion = convert_config(args.config)
    apply_overrides(conversion.config, flat_overrides(args.opt))
    text = conversion.to_yaml()
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    print(
        f"{args.config}: {conversion.suite} config converted" + (f" to {args.output}" if args.output else ""),
        file=sys.stderr,
    )
    for item in conversion.unmapped:
        print(f"not converted: {item}", file=sys.stderr)
    for item in conversion.notes:
        print(f"note: {item}", file=sys.stderr)
    try:
        validate(copy.deepcopy(conversion.config))
    except ConfigError as exc:
        print(f"warning: the converted config does not validate yet: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
