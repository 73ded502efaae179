"""Measure a config's throughput: ``python tools/benchmark.py -c CFG [-o Key=value ...] [--iters N]
[--warmup W] [--nproc K] [--json OUT]``.

Reports, in one run on one machine: the real trainer's steady-state samples/s against a bare
PyTorch loop over the same pre-loaded batches (the ratio is the trainer's overhead), the data
loader alone against the model's consumption rate, 1 vs K processes under torchrun (with
``--nproc K``), evaluation and inference throughput, and the environment. See docs/benchmarks.md.

``--input_pipeline [--images N] [--synthetic] [--repeat R]`` instead measures the input pipeline
alone, in one thread: CPU ms per image of each transform of the Train and Eval splits against a plain decode of
the same image bytes. ``--synthetic [--images N]`` (either mode) reads a synthetic set at the
recipe's real image size instead of the config's data.

``--count_ops [--count_size H W] [--count_batch N]`` instead counts the ATen operators of one
training step by phase (about one GPU kernel launch each): how launch-bound a recipe's step is.

``--step_time [--step_size H W] [--step_batch N] [--precisions fp32 bf16] [--size_costs]`` instead
times and profiles the bare training step on device-resident synthetic batches (and, for a
multi-scale recipe, what each size's first step costs with cuDNN autotuning on and off).
"""

from __future__ import annotations

import logging
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import torch

from ppdist.benchmark import measurements as m
from ppdist.benchmark.environment import describe_environment
from ppdist.benchmark.input_pipeline import markdown_table, run_input_pipeline
from ppdist.benchmark.measurements import measure_trainer, training_config
from ppdist.benchmark.op_count import format_op_count, measure_step_ops
from ppdist.benchmark.pipeline_data import with_synthetic_data
from ppdist.benchmark.report import best_run, format_report
from ppdist.benchmark.scaling import run_trainer_processes, scaling_summary
from ppdist.benchmark.step_time import (
    format_step_time,
    measure_size_costs,
    measure_step_time,
    size_cost_summary,
    spread,
)
from ppdist.benchmark.workers import loader_workers, with_workers
from ppdist.cli import base_parser, flat_overrides, positive_int, run_main
from ppdist.convert.configs import load_config
from ppdist.data.build import train_input_sizes
from ppdist.engine.capture_config import capture_refusal
from ppdist.engine.checkpoint import weights_source
from ppdist.engine.dist import DistEnv
from ppdist.engine.prepare import ensure_synthetic_data
from ppdist.engine.session import open_session
from ppdist.errors import ConfigError
from ppdist.inference.runners import list_images
from ppdist.utils import strict_json
from ppdist.utils.atomic import write_text_atomic

PARTS = ("loader", "bare", "trainer", "eval", "infer", "scaling")


def build_parser():
    parser = base_parser(__doc__)
    parser.add_argument("--iters", type=positive_int, default=50, help="timed training steps (default 50)")
    parser.add_argument(
        "--warmup", type=positive_int, default=10, help="untimed steps before them (default 10)"
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="K > 1 also measures K processes under torchrun against 1 (scaling)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of the single-process measurements (default: torch's default)",
    )
    parser.add_argument(
        "--scaling_threads",
        type=int,
        default=None,
        help="threads per process of both scaling runs (default: CPU cores // K on CPU, else 1)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="alternate bare loop and trainer (and the 1- and K-process runs) R times and keep the "
        "best of each, which is the least disturbed by other load (default 1); --input_pipeline: "
        "R passes over the same images, the fastest reported",
    )
    parser.add_argument(
        "--weights",
        default=None,
        help="checkpoint for the eval and infer measurements (default: Global.checkpoints or "
        "pretrained_model, else the initial weights)",
    )
    parser.add_argument(
        "--infer_dir", default=None, help="images for the infer measurement (default Global.infer_img)"
    )
    parser.add_argument(
        "--infer_images", type=int, default=200, help="at most this many images (default 200)"
    )
    parser.add_argument("--infer_batch_size", type=int, default=8)
    parser.add_argument(
        "--workers",
        default="auto",
        help="Train loader workers per process: 'auto' (default) = the node's cores per training "
        "process minus 1, at least 1; 'config' = the recipe's num_workers; or a count",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=PARTS, help="measurements to leave out")
    parser.add_argument(
        "--output_dir",
        default=None,
        help="trainer runs, logs and the JSON go here (default ./output/benchmark/<config name>)",
    )
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument(
        "--input_pipeline",
        action="store_true",
        help="only the input pipeline: CPU ms per image of each transform (one thread) and the "
        "ratio to a plain decode of the same images, Train and Eval",
    )
    parser.add_argument(
        "--images",
        type=int,
        default=256,
        help="--input_pipeline, --synthetic: images per split (default 256)",
    )
    parser.add_argument(
        "--synthetic",
        action="store_true",
        help="read a synthetic set of --images images per split at the recipe's real image size "
        "(det 640x480, seg 2048x1024, rec text lines, table PubTabNet-sized tables; drawn under "
        "--output_dir's parent the first time) instead of the config's data: the recipes measured where their data sets are not",
    )
    parser.add_argument(
        "--count_ops",
        action="store_true",
        help="only count the ATen operators of one training step (about one GPU kernel launch each; "
        "the count does not depend on the device), by phase, on synthetic batches of --count_batch "
        "at --count_size after --warmup steps, with Optimizer.fused on as on a GPU",
    )
    parser.add_argument(
        "--count_size",
        type=positive_int,
        nargs=2,
        default=[64, 64],
        metavar=("H", "W"),
        help="--count_ops: image height and width (default 64 64; text lines: the recipe's, e.g. 32 100)",
    )
    parser.add_argument(
        "--count_batch", type=positive_int, default=2, help="--count_ops: samples per step (default 2)"
    )
    parser.add_argument(
        "--step_time",
        action="store_true",
        help="only time and profile the bare training step (Trainer.step: no loader, no hooks) on "
        "synthetic batches already on the device, at --step_size with --step_batch, per precision of "
        "--precisions: median ms/step, samples/s, the host's time to issue a step, and on CUDA kernels "
        "per step, GPU-busy share and the top kernels (what the issue-41 GPU probe measured)",
    )
    parser.add_argument(
        "--step_size",
        type=positive_int,
        nargs=2,
        default=None,
        metavar=("H", "W"),
        help="--step_time: the recipe's real training input (e.g. 640 640 for PP-YOLOE-s, 512 1024 for "
        "the 1024x512 Cityscapes crops); default: the largest size of a multi-scale recipe",
    )
    parser.add_argument(
        "--step_batch",
        type=positive_int,
        default=None,
        help="--step_time: samples per step (default: the recipe's per-card batch)",
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        default=["config"],
        choices=("config", "fp32", "bf16", "config_graph", "fp32_graph", "bf16_graph"),
        help="--step_time: 'config' (as configured), 'fp32' (Global.use_amp=false) and/or 'bf16' "
        "(Global.use_amp=true Global.amp_dtype=bfloat16; channels_last follows), one after the other; "
        "'..._graph': the same with Global.cuda_graph (the captured step; a recipe it refuses is "
        "reported in one line and skipped)",
    )
    parser.add_argument(
        "--profile_steps",
        type=int,
        default=2,
        help="--step_time: steps under torch.profiler (0: none; default 2)",
    )
    parser.add_argument(
        "--size_costs",
        type=int,
        default=0,
        metavar="K",
        help="--step_time on a multi-scale recipe: also the first step at K of its training sizes "
        "(spread over the list; all when K >= their number) against the next ones, cuDNN autotuning "
        "on and off in turn: the search a size costs and the steady price of heuristics, for "
        "Global.cudnn_warmup / cudnn_benchmark (default 0: not measured)",
    )
    parser.add_argument(
        "--part",
        default="all",
        choices=("all", "trainer"),
        help="'trainer': only the trainer measurement (what the scaling runs start under torchrun)",
    )
    return parser


def write_json(result, path: str) -> None:
    write_text_atomic(path, strict_json.dumps(result, indent=2, default=str))


def run_trainer_part(args, config, env, save_dir: str) -> None:
    """Under torchrun: the trainer measurement, written by rank 0."""
    trainer = measure_trainer(
        training_config(config, args.warmup, args.iters, save_dir), env, args.warmup, args.iters
    )
    if env.is_main and args.json:
        write_json({"trainer": trainer}, args.json)


def run_all(args, config, env, overrides, output_dir: str) -> dict:
    glob = config["Global"]
    skip = set(args.skip)
    result = {
        "config": args.config,
        "overrides": overrides,
        "warmup": args.warmup,
        "iters": args.iters,
        "environment": describe_environment(config, env.device),
        "notes": [],
    }
    say = lambda text: print(f"benchmark: {text}", flush=True)  # noqa: E731
    train_cfg = m.training_config(config, args.warmup, args.iters, os.path.join(output_dir, "trainer"))
    if not {"bare", "loader"} <= skip:
        say(f"loading {args.warmup + args.iters} training batches (data loader alone)")
        batches, loader = m.load_batches(train_cfg, args.warmup + args.iters, args.warmup, env.device)
        result["loader"] = loader
    bare_runs, trainer_runs = [], []
    for attempt in range(max(1, args.repeat)):
        if "bare" not in skip:
            say(f"bare loop, run {attempt + 1}")
            bare_runs.append(
                m.measure_bare_loop(train_cfg, env.device, batches, args.warmup, loader["steps_per_epoch"])
            )
        if "trainer" not in skip:
            say(f"trainer, run {attempt + 1} (its log lines: {os.path.join(output_dir, 'benchmark.log')})")
            trainer_runs.append(m.measure_trainer(train_cfg, env, args.warmup, args.iters))
    if "bare" not in skip:
        del batches
        result["bare_loop"] = dict(best_run(bare_runs), runs=[r["median_samples_per_s"] for r in bare_runs])
    if trainer_runs:
        result["trainer"] = dict(
            best_run(trainer_runs), runs=[r["median_samples_per_s"] for r in trainer_runs]
        )
    if "bare_loop" in result and "trainer" in result:
        trainer, bare = result["trainer"], result["bare_loop"]
        result["trainer_overhead"] = trainer["median_samples_per_s"] / bare["median_samples_per_s"]
        result["trainer_overhead_window"] = trainer["samples_per_s"] / bare["samples_per_s"]
    if "loader" in skip:
        result.pop("loader", None)
    weights = args.weights or weights_source(glob)
    if weights == "auto":
        weights = None
    if "eval" not in skip:
        if config.get("Eval"):
            say("evaluation pass")
            result["eval"] = m.measure_eval(config, env, weights)
        else:
            result["notes"].append("no Eval section: eval not measured")
    if "infer" not in skip:
        infer_dir = args.infer_dir or glob["infer_img"]
        if infer_dir and os.path.exists(infer_dir):
            paths = list_images(infer_dir)[: args.infer_images]
            say(f"inference over {len(paths)} images")
            try:
                result["infer"] = m.measure_infer(config, weights, paths, args.infer_batch_size, env.device)
            except ConfigError as exc:  # a model the inference path does not take: the rest is measured
                say(f"infer not measured: {exc}")
                result["notes"].append(f"infer not measured: {exc}")
        else:
            result["notes"].append(
                f"infer not measured: no images (--infer_dir or Global.infer_img; got {infer_dir!r})"
            )
    if not weights and ("eval" in result or "infer" in result):
        result["notes"].append("eval/infer ran on the initial weights (--weights for a trained checkpoint)")
    if args.nproc > 1 and "scaling" not in skip:
        threads = args.scaling_threads or (
            max(1, (os.cpu_count() or 1) // args.nproc) if env.device.type == "cpu" else 1
        )
        if env.device.type == "cuda" and args.nproc > torch.cuda.device_count():
            raise ConfigError(
                f"--nproc {args.nproc} needs {args.nproc} GPUs, this machine has {torch.cuda.device_count()}"
            )
        runs = {1: [], args.nproc: []}
        for attempt in range(max(1, args.repeat)):  # alternated, like the bare loop and the trainer
            for nproc in runs:
                say(f"scaling: {nproc} process(es) x {threads} thread(s) under torchrun, run {attempt + 1}")
                runs[nproc].append(
                    run_trainer_processes(
                        nproc,
                        args.config,
                        overrides,
                        args.warmup,
                        args.iters,
                        threads,
                        os.path.join(output_dir, "scaling"),
                        args.workers,
                    )
                )
        single, multi = (
            dict(best_run(runs[n]), runs=[r["median_samples_per_s"] for r in runs[n]]) for n in runs
        )
        result["scaling"] = scaling_summary(single, multi, args.nproc)
    print(format_report(result), flush=True)
    return result


def synthetic_recipe(config, output_dir: str, images: int) -> dict:
    """``--synthetic``: ``config`` reading a synthetic set at the recipe's real size."""
    data_root = os.path.join(os.path.dirname(output_dir), "synthetic")
    print(f"benchmark: synthetic data at the recipe's size under {data_root}", flush=True)
    return with_synthetic_data(config, data_root, images)


def run_input_pipeline_part(args, config, output_dir: str) -> dict:
    """``--input_pipeline``: the per-transform table of each split, printed and returned."""
    if args.synthetic:
        config = synthetic_recipe(config, output_dir, args.images)
    splits = run_input_pipeline(config, args.images, ("Train", "Eval"), max(1, args.repeat))
    result = {
        "config": args.config,
        "synthetic": bool(args.synthetic),
        "environment": describe_environment(config, torch.device("cpu")),
        "input_pipeline": splits,
    }
    print(f"ppdist input pipeline: {args.config}\n", flush=True)
    print("\n\n".join(markdown_table(split) for split in splits.values()), flush=True)
    return result


PRECISIONS = {
    "config": [],
    "fp32": ["Global.use_amp=false"],
    "bf16": ["Global.use_amp=true", "Global.amp_dtype=bfloat16"],
}
PRECISIONS.update(
    {f"{name}_graph": [*overrides, "Global.cuda_graph=true"] for name, overrides in list(PRECISIONS.items())}
)


def run_step_time(args, overrides, name: str) -> dict:
    """``--step_time``: each precision's bare step, then (``--size_costs``) the per-size costs."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = {"config": args.config, "overrides": overrides, "device": str(device), "steps": {}}
    for precision in args.precisions:
        config = load_config(args.config, overrides + PRECISIONS[precision])
        refusal = capture_refusal(config)
        if refusal is not None:
            result["steps"][precision] = {"refused": refusal}
            print(f"step {name} {precision}: refused: {refusal}", flush=True)
            continue
        sizes = train_input_sizes(config)
        size = tuple(args.step_size or (max(sizes, key=lambda hw: hw[0] * hw[1]) if sizes else ()))
        if not size:
            raise ConfigError("--step_time needs --step_size H W: the recipe's training input size")
        batch = args.step_batch or int(config["Train"]["loader"]["batch_size_per_card"])
        record = measure_step_time(config, batch, size, device, args.warmup, args.iters, args.profile_steps)
        result["steps"][precision] = record
        print(format_step_time(name, precision, record), flush=True)
        if args.size_costs > 0 and len(sizes) > 1:
            records = measure_size_costs(config, batch, spread(sizes, args.size_costs), device)
            summary = size_cost_summary(records, len(sizes))
            result.setdefault("size_costs", {})[precision] = {"sizes": records, "summary": summary}
            for r in records:
                print(f"size {name} {precision}: {strict_json.dumps(r)}", flush=True)
            print(f"size costs {name} {precision}: {strict_json.dumps(summary)}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
    return result


def main() -> int:
    args = build_parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = flat_overrides(args.opt)
    config = load_config(args.config, overrides)
    if not config.get("Train"):
        raise ConfigError(f"{args.config}: missing required section Train")
    stem = os.path.splitext(os.path.basename(args.config))[0]
    output_dir = os.path.abspath(args.output_dir or os.path.join("output", "benchmark", stem))
    if args.count_ops:
        result = measure_step_ops(config, args.count_batch, tuple(args.count_size), args.warmup)
        result["config"] = args.config
        print(format_op_count(stem, result), flush=True)
        write_json(result, args.json or os.path.join(output_dir, "op_count.json"))
        return 0
    if args.step_time:
        result = run_step_time(args, overrides, stem)
        write_json(result, args.json or os.path.join(output_dir, "step_time.json"))
        return 0
    if args.input_pipeline:
        if not args.synthetic:
            ensure_synthetic_data(config, DistEnv())
        result = run_input_pipeline_part(args, config, output_dir)
        write_json(result, args.json or os.path.join(output_dir, "input_pipeline.json"))
        return 0
    session = open_session(config, "benchmarking", os.path.join(output_dir, "benchmark.log"))
    env, logger = session.env, session.logger
    for handler in list(logger.handlers):  # the trainer's lines go to the log file, the report to the console
        if not isinstance(handler, logging.FileHandler):
            logger.removeHandler(handler)
    try:
        if env.distributed and args.part == "all":
            raise ConfigError(
                "run tools/benchmark.py as one process (not under torchrun): --nproc K starts the "
                "K-process measurement under torchrun itself"
            )
        if args.synthetic:
            if args.nproc > 1 and "scaling" not in args.skip:
                raise ConfigError("--synthetic measures one process: add --skip scaling (or drop --nproc)")
            config = synthetic_recipe(config, output_dir, args.images)
        else:
            ensure_synthetic_data(config, env)
        processes = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size)) if env.distributed else 1
        config = with_workers(config, loader_workers(args.workers, config, processes))
        if args.part == "trainer":
            run_trainer_part(args, config, env, output_dir)
            return 0
        result = run_all(args, config, env, overrides, output_dir)
        write_json(result, args.json or os.path.join(output_dir, "benchmark.json"))
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    run_main(main)
