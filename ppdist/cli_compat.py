"""``tools/train.py``'s command line: the flags of PaddleOCR's, PaddleDetection's and PaddleSeg's
``tools/train.py``, each with the meaning it has in its own suite.

``parse_train_args`` reads PaddleOCR's ``-c/-o/-p``, PaddleDetection's (``--eval``, ``-r``, ``--amp``,
``--use_vdl``, ...) and PaddleSeg's (``--config``, ``--iters``, ``--do_eval``, ``--opts``, ...) flags;
``train_command`` turns them into the validated ppdist config. On a PaddleDetection or PaddleSeg
config, ``-o``/``--opts`` items in that suite's keys and the flags the suite applies to its own
config (PaddleDetection's ``--amp``/``--use_vdl``, PaddleSeg's ``--iters``/``--batch_size``/
``--learning_rate``) change the Paddle config *before* it is converted; the other flags set ppdist
keys; ``-o`` items in ppdist's sections (``Global.epoch_num=2``) act on the converted config last.
A flag with no ppdist equivalent is a one-line warning (``TrainCommand.notes``) when ignoring it
leaves the training the same, else a ``ConfigError``. docs/migrating_from_paddle.md has the table.
"""

from __future__ import annotations

import argparse
import ast
import copy
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ppdist.cli import base_parser, flat_overrides, positive_int
from ppdist.config import SECTIONS, merge_dicts, parse_value
from ppdist.config import load_config as load_ppdist_config
from ppdist.convert.configs import (
    PADDLEDET,
    PADDLESEG,
    Conversion,
    convert_mapping,
    detect_suite,
    read_any_suite,
    read_paddle_mapping,
)
from ppdist.errors import ConfigError

PADDLE_SUITES = (PADDLEDET, PADDLESEG)
PADDLESEG_EMA_DECAY = 0.999  # paddleseg.utils.ema.update_ema_model's default decay
PADDLESEG_LOSS_SCALE = 1024.0  # PaddleSeg's GradScaler(init_loss_scaling=1024) with --precision fp16
TRUE_WORDS = ("true", "1", "yes", "y", "on")
FALSE_WORDS = ("false", "0", "no", "n", "off")

# Flags accepted but not used: dest -> why (a warning when the flag is given).
IGNORED_FLAGS = {
    "fleet": "--fleet: ignored: ppdist trains with torch DistributedDataParallel under ppdist.launch/torchrun",
    "vdl_log_dir": "--vdl_log_dir: ignored: TensorBoard scalars go to Global.save_model_dir/tensorboard",
    "save_prediction_only": "--save_prediction_only: ignored: ppdist's evaluation always computes the metric",
    "save_proposals": "--save_proposals: ignored: no SNIPER proposal saving in ppdist",
    "proposals_path": "--proposals_path: ignored: no SNIPER proposal saving in ppdist",
    "to_static": "--to_static: ignored: no dynamic-to-static in ppdist (torch.compile: -o Global.compile=true)",
    "to_static_training": "--to_static_training: ignored: no dynamic-to-static in ppdist "
    "(torch.compile: -o Global.compile=true)",
    "output_op": "--output_op: ignored by training (an export option; see tools/export_model.py)",
    "input_shape": "--input_shape: ignored by training (an export option; see tools/export_model.py)",
    "for_fd": "--for_fd: ignored by training (an export option)",
}


@dataclass
class TrainCommand:
    """What ``tools/train.py`` runs: the validated ppdist config, the conversion of a
    PaddleDetection/PaddleSeg config (None otherwise) and the one-line notes to log."""

    config: Dict[str, Any]
    conversion: Optional[Conversion]
    notes: List[str] = field(default_factory=list)


def flag_bool(text: str) -> bool:
    """PaddleDetection's ``--use_vdl True``-style value (also ``false``, which Paddle's ``type=bool`` misreads)."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def train_parser(description: str) -> argparse.ArgumentParser:
    """``-c/-o/-p`` (PaddleOCR) plus PaddleDetection's and PaddleSeg's ``tools/train.py`` flags."""
    parser = base_parser(description)
    parser.add_argument(
        "-p",
        "--profiler_options",
        default=None,
        help="PaddleOCR's profiler options, e.g. 'batch_range=[10,20];profile_path=prof': profiles that "
        "window of steps (Global.profiler_options)",
    )
    parser.epilog = (
        "PaddleDetection's and PaddleSeg's flags: see docs/migrating_from_paddle.md (Training commands)."
    )
    det = parser.add_argument_group("PaddleDetection's flags")
    det.add_argument("--eval", action="store_true", help="evaluate during training (PaddleDetection config)")
    det.add_argument("-r", "--resume", "--resume_checkpoint", dest="resume", help="checkpoint to resume")
    det.add_argument("--amp", action="store_true", help="mixed precision (float16)")
    det.add_argument("--slim_config", help="not supported: ppdist has no slim (prune/quant/distill)")
    det.add_argument("--fleet", action="store_true", help="ignored")
    for name, what in (("--enable_ce", "seed 0"), ("--use_wandb", "Weights & Biases logging")):
        det.add_argument(name, nargs="?", const=True, default=None, type=flag_bool, metavar="BOOL", help=what)
    det.add_argument("--vdl_log_dir", help="ignored (TensorBoard writes to save_model_dir/tensorboard)")
    det.add_argument("--save_prediction_only", action="store_true", help="ignored")
    det.add_argument("--save_proposals", action="store_true", help="ignored")
    det.add_argument("--proposals_path", help="ignored")
    det.add_argument("--to_static", action="store_true", help="ignored")
    seg = parser.add_argument_group("PaddleSeg's flags")
    seg.add_argument("--device", choices=("gpu", "cpu", "xpu", "npu", "mlu"), help="gpu or cpu")
    seg.add_argument("--save_dir", help="Global.save_model_dir")
    seg.add_argument("--num_workers", type=int, help="data loader workers")
    seg.add_argument("--do_eval", action="store_true", help="evaluate every --save_interval iterations")
    both = "--use_vdl"  # PaddleSeg: a switch; PaddleDetection: --use_vdl True
    seg.add_argument(
        both, nargs="?", const=True, default=None, type=flag_bool, metavar="BOOL", help="TensorBoard"
    )
    seg.add_argument("--use_ema", action="store_true", help="EMA of the weights (decay 0.999)")
    seg.add_argument("--resume_model", help="checkpoint to resume")
    seg.add_argument("--iters", type=positive_int, help="training iterations")
    seg.add_argument("--batch_size", type=positive_int, help="batch size per process")
    seg.add_argument("--learning_rate", type=float, help="peak learning rate")
    seg.add_argument(
        "--save_interval", type=positive_int, help="save (and with --do_eval evaluate) every N iterations"
    )
    seg.add_argument("--log_iters", type=positive_int, help="log every N iterations")
    seg.add_argument("--keep_checkpoint_max", type=int, help="periodic checkpoints kept (<= 0: all)")
    seg.add_argument("--early_stop_intervals", type=int, help="stop after N evaluations without improvement")
    seg.add_argument("--seed", type=int, help="random seed")
    seg.add_argument("--precision", choices=("fp32", "fp16"), help="fp16: mixed precision")
    seg.add_argument("--amp_level", choices=("O1", "O2"), help="Global.amp_level")
    seg.add_argument("--data_format", choices=("NCHW", "NHWC"), help="NHWC: Global.channels_last")
    seg.add_argument("--repeats", type=int, help="not supported above 1")
    seg.add_argument("--use_multilabel", action="store_true", help="not supported")
    seg.add_argument("--opts", nargs="+", action="append", default=[], metavar="KEY=VALUE", help="overrides")
    seg.add_argument("--to_static_training", action="store_true", help="ignored")
    seg.add_argument("--output_op", help="ignored")
    seg.add_argument("--input_shape", nargs="+", type=int, help="ignored")
    seg.add_argument("--for_fd", action="store_true", help="ignored")
    return parser


def parse_train_args(description: str, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse ``tools/train.py``'s command line (``argv``: default ``sys.argv[1:]``)."""
    return train_parser(description).parse_args(argv)


# --------------------------------------------------------------------------- checks
def unsupported_flags(args: argparse.Namespace) -> List[str]:
    """One-line warnings for the given flags ppdist ignores; ``ConfigError`` for one whose
    absence would change the training."""
    if args.slim_config:
        raise ConfigError(
            f"--slim_config {args.slim_config}: not supported: ppdist has no PaddleSlim pruning, "
            f"quantization or distillation; train without it"
        )
    if args.device in ("xpu", "npu", "mlu"):
        raise ConfigError(f"--device {args.device}: not supported: ppdist trains on gpu (CUDA) or cpu")
    if args.repeats is not None and args.repeats > 1:
        raise ConfigError(
            f"--repeats {args.repeats}: not supported: ppdist does not repeat the training list "
            f"(repeat its lines in the file list instead)"
        )
    if args.use_multilabel:
        raise ConfigError("--use_multilabel: not supported: ppdist's segmentation is single-label")
    if args.resume and args.resume_model and args.resume != args.resume_model:
        raise ConfigError(
            f"-r {args.resume} and --resume_model {args.resume_model}: two checkpoints to resume; give one"
        )
    notes = [why for dest, why in IGNORED_FLAGS.items() if getattr(args, dest)]
    return notes


# --------------------------------------------------------------------------- overrides
def is_ppdist_override(item: str) -> bool:
    """``Global.epoch_num=2``: a key path in one of ppdist's sections (else a Paddle suite's key)."""
    return item.split("=", 1)[0].strip().split(".")[0] in SECTIONS


def _split(item: str, flag: str) -> Tuple[List[str], str]:
    if "=" not in item:
        raise ConfigError(f"{flag} {item!r}: expected key=value")
    key, text = item.split("=", 1)
    return key.strip().split("."), text


def merge_det_override(data: Dict[str, Any], item: str) -> Dict[str, Any]:
    """PaddleDetection's ``-o a.b=value``: the value read as YAML, merged into the config
    (missing keys created)."""
    parts, text = _split(item, "-o")
    try:
        value: Any = parse_value(text)
    except ValueError as exc:
        raise ConfigError(f"-o {item!r}: {exc}") from None
    for part in reversed(parts):
        value = {part: value}
    return merge_dicts(data, value)


def set_seg_override(data: Dict[str, Any], item: str) -> None:
    """PaddleSeg's ``--opts a.b=value``: the value read as a Python literal (else kept as text; a
    tuple as a list); every key but the last must exist."""
    parts, text = _split(item, "--opts")
    try:
        value: Any = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    if isinstance(value, tuple):  # ``scales=0.75,1.0``: a list in the YAML configs
        value = list(value)
    node = data
    for depth, part in enumerate(parts[:-1]):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(parts[: depth + 1])
            raise ConfigError(f"--opts {item!r}: {where} is not in the config")
        node = node[part]
    if not isinstance(node, dict):
        raise ConfigError(f"--opts {item!r}: {'.'.join(parts[:-1])} is not a mapping")
    node[parts[-1]] = value


def edit_paddle_config(
    data: Dict[str, Any],
    suite: str,
    args: argparse.Namespace,
    det_items: Sequence[str],
    seg_items: Sequence[str],
) -> Dict[str, Any]:
    """The Paddle config changed as the suite's own ``tools/train.py`` changes it before building:
    PaddleDetection copies ``--amp``/``--use_vdl`` into its config (absent: off), then applies ``-o``;
    PaddleSeg sets ``iters``/``batch_size``/``lr_scheduler.learning_rate`` from its flags, then ``--opts``."""
    if suite == PADDLEDET:
        data["amp"] = bool(args.amp)
        data["use_vdl"] = bool(args.use_vdl)
        if args.learning_rate is not None:
            data.setdefault("LearningRate", {})["base_lr"] = args.learning_rate
    elif suite == PADDLESEG:
        if args.iters:
            data["iters"] = args.iters
        if args.batch_size:
            data["batch_size"] = args.batch_size
        if args.learning_rate:
            if isinstance(data.get("lr_scheduler"), dict) or "learning_rate" not in data:
                data.setdefault("lr_scheduler", {})["learning_rate"] = args.learning_rate
            else:  # PaddleSeg 2.0's learning_rate: {value, decay}
                data["learning_rate"]["value"] = args.learning_rate
    for item in det_items:
        data = merge_det_override(data, item)
    for item in seg_items:
        set_seg_override(data, item)
    return data


# --------------------------------------------------------------------------- ppdist keys
def set_key(config: Dict[str, Any], path: str, value: Any) -> None:
    """``config[a][b][c] = value`` for ``path`` ``a.b.c`` (mappings created on the way)."""
    parts = path.split(".")
    node = config
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def set_learning_rate(config: Dict[str, Any], value: float) -> str:
    """``--learning_rate`` on a ppdist config: the schedule's peak (``Optimizer.lr.learning_rate``;
    a Piecewise schedule's ``values`` scaled so that the largest is ``value``). Returns a note."""
    lr = (config.get("Optimizer") or {}).get("lr")
    if not isinstance(lr, dict):
        raise ConfigError(f"--learning_rate {value}: the config has no Optimizer.lr section")
    if lr.get("name") == "Piecewise" and lr.get("values"):
        scale = value / max(float(v) for v in lr["values"])
        lr["values"] = [float(v) * scale for v in lr["values"]]
        if "learning_rate" in lr:  # not read by Piecewise, kept equal to its first rate
            lr["learning_rate"] = lr["values"][0]
        return f"--learning_rate {value}: Optimizer.lr.values scaled to {lr['values']}"
    lr["learning_rate"] = value
    return f"--learning_rate {value}: Optimizer.lr.learning_rate"


def flag_settings(args: argparse.Namespace, suite: str, config: Dict[str, Any]) -> List[Tuple[str, Any]]:
    """``(ppdist key path, value)`` for the flags that set ppdist keys, in the order they apply
    (before the ``-o`` overrides in ppdist's sections, which win, as ``-o`` wins in the suites)."""
    paddle, seg = suite in PADDLE_SUITES, suite == PADDLESEG
    out: List[Tuple[str, Any]] = []
    if paddle:
        out.append(("Global.eval_during_train", bool(args.eval or args.do_eval)))
    if args.device is not None:
        out.append(("Global.use_gpu", args.device == "gpu"))
    if args.save_dir:
        out.append(("Global.save_model_dir", args.save_dir))
    if args.num_workers is not None:
        out.append(("Train.loader.num_workers", args.num_workers))
        if seg and config.get("Eval"):  # PaddleSeg evaluates with 1 worker when training uses any
            out.append(("Eval.loader.num_workers", min(args.num_workers, 1)))
    if args.use_vdl is not None and suite != PADDLEDET:  # PaddleDetection's: its use_vdl key, converted
        out.append(("Global.use_visualdl", bool(args.use_vdl)))
    if args.use_ema:
        out.append(("Global.use_ema", True))
        if seg:
            out += [("Global.ema_decay", PADDLESEG_EMA_DECAY), ("Global.ema_decay_type", "threshold")]
    resume = args.resume or args.resume_model
    if resume:
        out.append(("Global.checkpoints", resume))
    if args.iters and not seg:
        out.append(("Global.max_iters", args.iters))
    if args.batch_size and not seg:
        out.append(("Train.loader.batch_size_per_card", args.batch_size))
    if args.save_interval is not None:
        out += [
            ("Global.save_iter_step", args.save_interval),
            ("Global.eval_batch_step", [0, args.save_interval]),
            ("Global.eval_batch_epoch", None),
        ]
    if args.log_iters is not None:
        out.append(("Global.print_batch_step", args.log_iters))
        if seg:
            out.append(("Global.log_smooth_window", args.log_iters))
    if args.keep_checkpoint_max is not None:
        out.append(
            ("Global.keep_checkpoint_max", args.keep_checkpoint_max if args.keep_checkpoint_max > 0 else None)
        )
    if args.early_stop_intervals is not None:
        out.append(("Global.early_stop", {"patience": args.early_stop_intervals, "min_delta": 0.0}))
    if args.seed is not None:
        out.append(("Global.seed", args.seed))
    elif args.enable_ce:
        out.append(("Global.seed", 0))  # PaddleDetection's --enable_ce: set_random_seed(0)
    if args.amp and suite != PADDLEDET:
        out += [("Global.use_amp", True), ("Global.amp_dtype", "float16")]
    if args.precision == "fp16":
        out += [("Global.use_amp", True), ("Global.amp_dtype", "float16")]
        if seg:
            out.append(("Global.scale_loss", PADDLESEG_LOSS_SCALE))
    elif args.precision == "fp32":
        out.append(("Global.use_amp", False))
    if args.amp_level is not None:
        out.append(("Global.amp_level", args.amp_level))
    if args.data_format == "NHWC":
        out.append(("Global.channels_last", True))
    if args.use_wandb is not None:
        out.append(("Global.use_wandb", bool(args.use_wandb)))
    if args.profiler_options:
        out.append(("Global.profiler_options", args.profiler_options))
    return out


def flag_notes(args: argparse.Namespace, suite: str) -> List[str]:
    """One-line notes for flags that map to ppdist keys with a difference worth knowing."""
    notes = []
    if suite in PADDLE_SUITES and not (args.eval or args.do_eval):
        flag = "--eval" if suite == PADDLEDET else "--do_eval"
        notes.append(
            f"no evaluation during training (Global.eval_during_train false): add {flag} to evaluate"
        )
    if args.use_ema and suite == PADDLESEG:
        notes.append(
            "--use_ema: Global.use_ema with decay 0.999, warm-up ramp min(decay, (1+t)/(10+t)) "
            "(PaddleSeg's is min(decay, t/(t+1)))"
        )
    if args.early_stop_intervals is not None:
        notes.append(
            f"--early_stop_intervals {args.early_stop_intervals}: Global.early_stop patience "
            f"{args.early_stop_intervals} (evaluations since the best)"
        )
    if args.data_format == "NHWC":
        notes.append("--data_format NHWC: Global.channels_last true (NHWC memory format, same model)")
    return notes


# --------------------------------------------------------------------------- the command
def train_command(args: argparse.Namespace) -> TrainCommand:
    """The validated ppdist config of a parsed ``tools/train.py`` command line, as the suite of
    ``args.config`` would train it; ``ConfigError`` (one line) for a flag ppdist cannot honour."""
    notes = unsupported_flags(args)
    path = args.config
    suite = detect_suite(path)
    opt_items = flat_overrides(args.opt)
    opts_items = flat_overrides(args.opts)
    conversion: Optional[Conversion] = None
    if suite in PADDLE_SUITES:
        ppdist_items = [item for item in opt_items + opts_items if is_ppdist_override(item)]
        try:
            data = read_paddle_mapping(path, suite)
            data = edit_paddle_config(
                data,
                suite,
                args,
                [item for item in opt_items if not is_ppdist_override(item)],
                [item for item in opts_items if not is_ppdist_override(item)],
            )
            conversion = convert_mapping(data, path, suite)
        except ConfigError as exc:
            message = str(exc)
            raise ConfigError(message if message.startswith(path) else f"{path}: {message}") from None
    else:
        ppdist_items = opt_items + opts_items

    def read(config_path: str) -> Dict[str, Any]:
        """The ppdist mapping with the flags' keys set (the ``-o`` overrides come after)."""
        config = copy.deepcopy(conversion.config) if conversion is not None else read_any_suite(config_path)
        if args.learning_rate is not None and conversion is None:
            notes.append(set_learning_rate(config, args.learning_rate))
        for key, value in flag_settings(args, suite, config):
            set_key(config, key, value)
        return config

    config = load_ppdist_config(path, ppdist_items, read=read)
    return TrainCommand(config, conversion, notes + flag_notes(args, suite))
