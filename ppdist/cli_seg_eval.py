"""PaddleSeg's test-time flags of ``tools/val.py`` / ``tools/predict.py`` for ``tools/eval.py`` and
``tools/infer.py``: ``--aug_eval [--scales ...] [--flip_horizontal] [--flip_vertical]`` and
``--is_slide --crop_size W H --stride W H``, merged into ``PostProcess`` (SegPostProcess) as
PaddleSeg's ``merge_test_config`` merges them into ``test_config``: ``--aug_eval`` sets all four of
its keys (``scales`` 1.0 unless given, absent flips off), ``--is_slide`` all three of its keys.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, List

from ppdist.errors import ConfigError
from ppdist.utils import strict_json


def add_seg_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags, in a group of their own."""
    seg = parser.add_argument_group(
        "segmentation test-time options (PaddleSeg's val.py flags; override PostProcess / inference.yml)"
    )
    seg.add_argument("--aug_eval", action="store_true", help="average the logits over --scales and flips")
    seg.add_argument(
        "--scales",
        type=float,
        nargs="+",
        default=None,
        help="with --aug_eval, e.g. 0.75 1.0 1.25 (default 1.0)",
    )
    seg.add_argument("--flip_horizontal", action="store_true", help="with --aug_eval")
    seg.add_argument("--flip_vertical", action="store_true", help="with --aug_eval")
    seg.add_argument("--is_slide", action="store_true", help="sliding-window inference")
    seg.add_argument("--crop_size", type=int, nargs=2, default=None, metavar=("W", "H"), help="window size")
    seg.add_argument("--stride", type=int, nargs=2, default=None, metavar=("W", "H"), help="window step")


def seg_eval_overrides(args: argparse.Namespace) -> Dict[str, Any]:
    """The ``PostProcess`` keys the given flags set (empty without ``--aug_eval`` / ``--is_slide``)."""
    overrides: Dict[str, Any] = {}
    if args.aug_eval:
        overrides.update(
            aug_eval=True,
            scales=list(args.scales) if args.scales else 1.0,
            flip_horizontal=bool(args.flip_horizontal),
            flip_vertical=bool(args.flip_vertical),
        )
    if args.is_slide:
        if args.crop_size is None or args.stride is None:
            raise ConfigError("--is_slide needs --crop_size W H and --stride W H (the window and its step)")
        overrides.update(is_slide=True, crop_size=list(args.crop_size), stride=list(args.stride))
    return overrides


def override_items(overrides: Dict[str, Any]) -> List[str]:
    """``-o`` items (``PostProcess.key=value``, values as YAML) for the config loader."""
    return [f"PostProcess.{key}={strict_json.dumps(value)}" for key, value in overrides.items()]
