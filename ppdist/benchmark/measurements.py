"""The individual measurements: trainer, bare loop, data loader, evaluation and inference.

Each takes a validated config and returns plain numbers. The trainer and the bare loop run
the same model, loss, optimizer and LR schedule (and EMA / gradient clipping when the config
uses them) on the same batches; the bare loop gets them pre-loaded on the device, the trainer
reads them through its data loader and does everything it normally does (logging, DDP, ...).
Before their steps both visit every input size of a multi-scale recipe once (cuDNN's searches,
if autotuning is on, and per-shape caches land there, not in the timed window), and both time
each step (``steady_state``).
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from ppdist.benchmark.steady_state import StepClock, StepMarks, window_summary
from ppdist.clipping import clip_gradients, needs_clipping
from ppdist.components import build_loss, build_metric, build_model, build_postprocess, class_vocabulary
from ppdist.config import compile_options
from ppdist.data.base import BAD_SAMPLES_KEY
from ppdist.data.build import build_dataloader, set_min_image_size, train_input_sizes
from ppdist.engine import checkpoint as ckpt
from ppdist.engine.batch import batch_size_of, move_to_device
from ppdist.engine.dist import DistEnv
from ppdist.engine.ema import ModelEMA
from ppdist.engine.runtime import build_runtime
from ppdist.engine.setup import build_trainer
from ppdist.engine.size_warmup import synthetic_batch, warm_input_sizes, warm_training_sizes
from ppdist.engine.step_batches import EPOCH_KEY
from ppdist.export.deploy_modules import build_deploy
from ppdist.inference.backends import TorchBackend
from ppdist.inference.infer import infer
from ppdist.inference.runners import build_runner, inference_info_from_config
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule
from ppdist.modeling.deploy import convert_to_deploy
from ppdist.modeling.input_size import min_input_size
from ppdist.optim import build_optimizer
from ppdist.utils.rng import seed_everything


def training_config(config: Mapping[str, Any], warmup: int, iters: int, save_dir: str) -> Dict[str, Any]:
    """``config`` set up for a timed run: exactly ``warmup + iters`` steps, no evaluation, no
    resume, no intermediate checkpoints, outputs under ``save_dir``."""
    config = copy.deepcopy(dict(config))
    config.pop("Eval", None)
    glob = config["Global"]
    glob.update(
        max_iters=int(warmup) + int(iters),
        save_model_dir=save_dir,
        checkpoints=None,
        overwrite=True,  # a measurement's own folder: each run replaces the last
        save_iter_step=None,
        save_epoch_step=10**9,
    )
    return config


def measure_trainer(config: Dict[str, Any], env: DistEnv, warmup: int, iters: int) -> Dict[str, Any]:
    """Steady-state samples/s of ``Trainer.train()`` (all processes together) and its costs."""
    clock = StepClock(warmup, iters, env.device)
    trainer = build_trainer(config, env, hooks=[clock])
    sizes = train_input_sizes(config)
    warmed = config["Global"]["cudnn_warmup"] == "all_sizes"  # then build_trainer visited them
    visited = sizes if warmed or len(sizes) < 2 else warm_training_sizes(trainer, config, sizes)["sizes"]
    trainer.train()
    result = clock.throughput()
    result["warmed_sizes"] = [list(size) for size in visited] if len(sizes) > 1 else []
    result["world_size"] = env.world_size
    ddp = getattr(trainer.train_model, "_orig_mod", trainer.train_model)  # under Global.compile
    if isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        result["ddp"] = {
            "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view),
            "static_graph": bool(ddp.static_graph),
            "bucket_cap_mb": float(ddp.bucket_bytes_cap) / 2**20,
            "find_unused_parameters": bool(ddp.find_unused_parameters),
        }
    return result


def load_batches(
    config: Mapping[str, Any], count: int, warmup: int, device: torch.device
) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """The first ``count`` training batches of a single-process run (epoch after epoch), moved to
    ``device``; also the loader's own throughput over the batches after ``warmup`` and its
    batches per epoch."""
    loader = build_dataloader(config, "Train", "train", 0, 1, device.type)
    sampler = loader.batch_sampler
    raw: List[Tuple[int, Dict[str, Any]]] = []
    start = None
    timed_samples = 0
    epoch = 1
    while len(raw) < count:
        sampler.set_epoch(epoch)
        sampler.set_position(0)
        for batch in loader:
            if len(raw) == warmup:
                start = time.perf_counter()
            batch.pop(BAD_SAMPLES_KEY, None)
            if len(raw) >= warmup:
                timed_samples += batch_size_of(batch)
            raw.append((epoch, batch))
            if len(raw) >= count:
                break
        epoch += 1
    seconds = time.perf_counter() - start if start is not None else 0.0
    steps_per_epoch = len(loader)
    del loader  # stop the workers before the model runs
    batches = []  # kept on the host: the bare loop moves them to the device for its own run only
    for epoch_of_batch, batch in raw:
        batch[EPOCH_KEY] = epoch_of_batch - 1
        batches.append(batch)
    loader_result = {
        "samples_per_s": timed_samples / seconds if seconds > 0 else 0.0,
        "samples": timed_samples,
        "batches": count - warmup,
        "seconds": seconds,
        "steps_per_epoch": steps_per_epoch,
        "num_workers": int(config["Train"]["loader"]["num_workers"]),
    }
    return batches, loader_result


def measure_bare_loop(
    config: Mapping[str, Any],
    device: torch.device,
    batches: List[Dict[str, Any]],
    warmup: int,
    steps_per_epoch: int,
) -> Dict[str, Any]:
    """samples/s of a plain forward/backward/step loop over pre-loaded ``batches`` (moved to the
    device before the clock starts and freed after)."""
    glob = config["Global"]
    opt_cfg = config["Optimizer"]
    seed_everything(glob["seed"])
    sizes = train_input_sizes(config)
    runtime = build_runtime(glob, device, len(sizes))
    model = runtime.place(build_model(config))
    apply_statistics_rule(model, glob["bn_statistics"])
    model.train()
    options = compile_options(glob)
    network = torch.compile(model, **options) if options is not None else model
    loss_fn = build_loss(config)
    if isinstance(loss_fn, torch.nn.Module):
        loss_fn.to(device)
    host_keys = tuple(getattr(loss_fn, "host_keys", ()))
    batches = [
        move_to_device(batch, device, runtime.channels_last, keep_on_host=host_keys) for batch in batches
    ]
    total = len(batches)
    optimizer, scheduler = build_optimizer(
        opt_cfg, model, math.ceil(total / steps_per_epoch), steps_per_epoch, total
    )
    scaler = runtime.grad_scaler(glob)
    ema = (
        ModelEMA(model, decay=glob["ema_decay"], decay_type=glob["ema_decay_type"])
        if glob["use_ema"]
        else None
    )
    clip = needs_clipping(opt_cfg, glob["grad_clip"])
    batch_size = int(config["Train"]["loader"]["batch_size_per_card"])

    def warm_batch(size: Tuple[int, int]) -> Dict[str, Any]:
        batch = move_to_device(
            synthetic_batch(config, size, batch_size), device, runtime.channels_last, keep_on_host=host_keys
        )
        return dict(batch, **{EPOCH_KEY: 0})

    visited = (
        warm_input_sizes(network, loss_fn, sizes, warm_batch, runtime.autocast) if len(sizes) > 1 else []
    )
    clock = StepMarks(device)
    steps: List[Dict[str, Any]] = []
    for index, batch in enumerate(batches):
        if index == warmup:
            clock.mark()  # the end of the last warm-up step
        with runtime.autocast():
            preds = network(dict(batch))
        loss = loss_fn(preds, dict(batch))["loss"]
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(optimizer)
            clip_gradients(model, opt_cfg, glob["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        if ema is not None:
            ema.update(model)
        if index >= warmup:
            clock.mark()
            steps.append({"samples": batch_size_of(batch)})
    result = window_summary(steps, clock.intervals())
    result["warmed_sizes"] = [list(size) for size in visited]
    return result


def build_weighted_model(
    config: Mapping[str, Any], weights: Optional[str], device: torch.device
) -> torch.nn.Module:
    """The config's model with the inference weights of ``weights`` (EMA when kept), or its
    initial weights when none are given."""
    seed_everything(config["Global"]["seed"])
    model = build_model(config)
    if weights:
        ckpt.load_inference_weights(
            model, ckpt.load_file(ckpt.checkpoint_path(weights)), weights, class_vocabulary(config)
        )
    return model.to(device).eval()


def measure_eval(config: Mapping[str, Any], env: DistEnv, weights: Optional[str]) -> Dict[str, Any]:
    """One pass of the evaluator over the Eval set: samples/s and the metrics."""
    glob = config["Global"]
    runtime = build_runtime(glob, env.device)
    model = runtime.place(build_weighted_model(config, weights, env.device))
    loader = build_dataloader(config, "Eval", "eval", env.rank, env.world_size, env.device.type)
    set_min_image_size(loader, min_input_size(model))
    metric = build_metric(config)
    evaluator = runtime.evaluator(loader, build_postprocess(config), metric, env)
    start = time.perf_counter()
    metrics = evaluator.run(model, desc="benchmark eval")
    seconds = time.perf_counter() - start
    return {
        "samples_per_s": evaluator.last_fps,
        "samples": len(loader.dataset),
        "seconds": seconds,
        "num_workers": int(config["Eval"]["loader"]["num_workers"]),
        "batch_size": int(config["Eval"]["loader"]["batch_size_per_card"]),
        "metric": {metric.main_indicator: metrics.get(metric.main_indicator)},
    }


def measure_infer(
    config: Mapping[str, Any], weights: Optional[str], paths: List[str], batch_size: int, device: torch.device
) -> Dict[str, Any]:
    """images/s of the inference path (file -> preprocess -> deploy model -> post-process) with
    the PyTorch backend, after one warm-up batch."""
    model = convert_to_deploy(build_weighted_model(config, weights, device))
    module, spec = build_deploy(model, config)
    backend = TorchBackend(module, spec.output_names, spec.input_names, device.type)
    runner = build_runner(inference_info_from_config(config))
    infer(paths[:batch_size], runner, backend, batch_size=batch_size, progress=False)
    result = infer(paths, runner, backend, batch_size=batch_size, progress=False)
    return {
        "images_per_s": result["images_per_s"],
        "images": result["images"],
        "seconds": result["seconds"],
        "batch_size": batch_size,
        "backend": "pytorch",
    }
