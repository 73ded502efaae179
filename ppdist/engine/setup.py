"""Build the parts of a training run from a validated config, and the trainer that runs them.

``build_trainer(config, env)`` is what ``tools/train.py`` runs: data loaders, the model placed on
the device (channels_last, SyncBatchNorm), loss, optimizer and LR schedule (``auto_scale_lr``),
AMP, EMA, the evaluator, DDP and ``torch.compile``, the hooks of the ``Global`` keys and of
``Global.hooks``, then the starting point: a checkpoint to resume or the initial weights. Each
part has its own function, usable without the others (tests, the benchmark, notebooks).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ppdist.optim as optim
from ppdist.builder import build_component
from ppdist.clipping import clip_gradients, needs_clipping
from ppdist.components import build_loss, build_metric, build_model, build_postprocess, class_vocabulary
from ppdist.config import (
    auto_scale_lr_base,
    compile_options,
    early_stop_settings,
    mlflow_settings,
    profiler_settings,
    wandb_settings,
)
from ppdist.data.build import build_dataloader, input_size_count, loader_input_sizes, set_min_image_size
from ppdist.engine.amp import make_grad_scaler
from ppdist.engine.capture_config import check_capture_config, fused_by_default
from ppdist.engine.device_settings import broadcast_buffers, channels_last
from ppdist.engine.dist import DistEnv
from ppdist.engine.ema import ModelEMA
from ppdist.engine.evaluator import Evaluator
from ppdist.engine.hooks import (
    BadSampleCheck,
    Checkpointer,
    EarlyStopping,
    Evaluation,
    Hook,
    MLflowTracker,
    NonFiniteGuard,
    RunDirRelease,
    TorchProfiler,
    TrainingCurves,
    TrainLogger,
    WandbTracker,
)
from ppdist.engine.logger import ScalarWriter
from ppdist.engine.position import run_length
from ppdist.engine.resume import resume_or_initialize
from ppdist.engine.runtime import build_runtime
from ppdist.engine.session import open_session
from ppdist.engine.size_warmup import warm_training_sizes
from ppdist.engine.trainer import Trainer
from ppdist.engine.update import WeightUpdate
from ppdist.modeling.batch_norm_statistics import apply_statistics_rule
from ppdist.modeling.input_size import min_input_size
from ppdist.modeling.sync_batch_norm import convert_sync_batchnorm
from ppdist.registry import HOOKS
from ppdist.utils.memory import keep_freed_memory
from ppdist.utils.rng import seed_everything

logger = logging.getLogger("ppdist")


def gradient_as_bucket_view(glob: Mapping[str, Any], device: torch.device) -> bool:
    """``Global.gradient_as_bucket_view``; unset: on with CUDA, off on CPU, where gloo DDP steps
    measured slower with it (docs/benchmarks.md)."""
    setting = glob["gradient_as_bucket_view"]
    return device.type == "cuda" if setting is None else bool(setting)


def uses_sync_bn(glob: Mapping[str, Any], env: DistEnv) -> bool:
    """SyncBatchNorm where it means something: several processes (NCCL or gloo)."""
    return bool(glob["use_sync_bn"]) and env.distributed


def place_model(model: nn.Module, glob: Mapping[str, Any], env: DistEnv) -> nn.Module:
    """``model`` on the device, in channels_last when it applies, with ppdist's SyncBatchNorm
    (no host read per layer) under DDP, its BatchNorms updating running statistics by
    ``Global.bn_statistics``."""
    model = model.to(env.device)
    if channels_last(glob, env.device):
        model = model.to(memory_format=torch.channels_last)
    if uses_sync_bn(glob, env):
        model = convert_sync_batchnorm(model)
    apply_statistics_rule(model, glob["bn_statistics"])
    return model


@functools.lru_cache(maxsize=1)
def _ddp_takes_forward_sync_buffers() -> bool:
    return "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters


def ddp_buffer_sync(sync: bool) -> Dict[str, bool]:
    """DDP's keyword for re-sending rank 0's buffers before every forward: ``forward_sync_buffers``
    where torch has it (it deprecates ``broadcast_buffers`` with a warning per process),
    ``broadcast_buffers`` before. The one difference, a broadcast of the buffers at construction,
    changes nothing here: every process builds the same model or loads the same checkpoint."""
    return {"forward_sync_buffers" if _ddp_takes_forward_sync_buffers() else "broadcast_buffers": sync}


def wrap_for_training(
    model: nn.Module, glob: Mapping[str, Any], env: DistEnv, input_sizes: int = 1
) -> nn.Module:
    """What the training forward calls: DDP over several processes, then ``torch.compile`` when
    ``Global.compile`` asks (checkpoints and evaluation use ``model`` itself). ``input_sizes``:
    how many input shapes training sees (multi-scale training), for the recompile limit."""
    wrapped: nn.Module = model
    if env.distributed:
        wrapped = DistributedDataParallel(
            model,
            device_ids=[env.device.index] if env.device.type == "cuda" else None,
            gradient_as_bucket_view=gradient_as_bucket_view(glob, env.device),
            static_graph=glob["static_graph"],
            bucket_cap_mb=glob["bucket_cap_mb"],
            find_unused_parameters=glob["find_unused_parameters"],
            **ddp_buffer_sync(broadcast_buffers(glob, uses_sync_bn(glob, env))),
        )
    options = compile_options(glob)
    if options is not None:
        wrapped = compile_for_training(wrapped, options, input_sizes)
    return wrapped


def compile_for_training(module: nn.Module, options: Mapping[str, Any], input_sizes: int) -> nn.Module:
    """``torch.compile(module, **options)`` with a recompile limit that fits every training input
    size (one graph per size and a few for the automatic switch to dynamic shapes); going past it
    is an error, never a silent fall back to eager."""
    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, 2 * input_sizes + 2)
    dynamo.fail_on_recompile_limit_hit = True
    logger.info(
        "Global.compile: torch.compile(%s); %d training input size(s), dynamic=%s, recompile limit %d "
        "(past it training stops with an error instead of running eager)",
        ", ".join(f"{k}={v!r}" for k, v in options.items()),
        input_sizes,
        options.get("dynamic", "automatic"),
        dynamo.recompile_limit,
    )
    return torch.compile(module, **options)


def lr_factor(glob: Mapping[str, Any], global_batch_size: Optional[int]) -> float:
    """``Global.auto_scale_lr``: global batch / base_batch_size (1 when off or not known)."""
    base = auto_scale_lr_base(glob)
    return global_batch_size / base if base and global_batch_size else 1.0


def build_optimizer(
    config: Mapping[str, Any],
    model: nn.Module,
    steps_per_epoch: int,
    global_batch_size: Optional[int] = None,
) -> Tuple[torch.optim.Optimizer, optim.IterScheduler]:
    """The ``Optimizer`` section's optimizer and per-iteration LR schedule for a run of
    ``steps_per_epoch`` steps per epoch (the schedule's length from ``Global.epoch_num`` or
    ``max_iters``); with ``Global.auto_scale_lr`` and ``global_batch_size`` every learning rate
    is scaled by global batch / base batch."""
    glob = config["Global"]
    epochs, total_steps = run_length(glob["epoch_num"], glob["max_iters"], steps_per_epoch)
    section = fused_by_default(config)
    factor = lr_factor(glob, global_batch_size)
    if auto_scale_lr_base(glob):
        section = dict(section, lr=optim.scale_learning_rates(section["lr"], factor))
    return optim.build_optimizer(section, model, epochs, steps_per_epoch, total_steps)


def build_ema(model: nn.Module, glob: Mapping[str, Any]) -> Optional[ModelEMA]:
    if not glob["use_ema"]:
        return None
    return ModelEMA(model, decay=glob["ema_decay"], decay_type=glob["ema_decay_type"])


def gradient_clipper(config: Mapping[str, Any]) -> Optional[Callable[[nn.Module], Any]]:
    """``clip(model)`` for ``Optimizer.clip_norm`` / ``clip_norm_global`` / ``Global.grad_clip``; None when off."""
    section, global_clip = config["Optimizer"], config["Global"]["grad_clip"]
    if not needs_clipping(section, global_clip):
        return None
    return functools.partial(clip_gradients, opt_cfg=section, global_clip=global_clip)


def default_hooks(
    config: Mapping[str, Any], evaluator: Optional[Evaluator], main_indicator: str
) -> List[Hook]:
    """The hooks every run has, configured by ``Global`` keys (evaluation only with an Eval set)."""
    glob = config["Global"]
    hooks: List[Hook] = [
        BadSampleCheck(glob["max_bad_sample_ratio"], period=glob["print_batch_step"]),
        TrainLogger(glob["print_batch_step"], glob["log_smooth_window"], memory_info=glob["print_mem_info"]),
        NonFiniteGuard(period=glob["print_batch_step"], max_ratio=glob["max_skipped_step_ratio"]),
        Checkpointer(glob["save_epoch_step"], glob["save_iter_step"], glob["keep_checkpoint_max"]),
    ]
    if evaluator is not None:
        hooks.append(
            Evaluation(
                evaluator,
                main_indicator,
                glob["eval_batch_step"],
                glob["eval_batch_epoch"],
                draw_pictures=glob["eval_pictures"],
            )
        )
        early_stop = early_stop_settings(glob)
        if early_stop is not None:
            hooks.append(EarlyStopping(*early_stop))
    elif glob["early_stop"]:
        logger.warning("Global.early_stop needs an Eval section to judge the main indicator: it is off")
    if glob["plot_curves"]:
        hooks.append(TrainingCurves())
    hooks += tracker_hooks(config)
    profiler_options = profiler_settings(glob)
    if profiler_options is not None:
        hooks.append(TorchProfiler(profiler_options, os.path.join(glob["save_model_dir"], "profiler")))
    return hooks


def tracker_hooks(config: Mapping[str, Any]) -> List[Hook]:
    """MLflow (``Global.mlflow``) and W&B (``Global.use_wandb`` / the ``wandb`` section) beside
    TensorBoard; they log from rank 0 only."""
    checkpoints = config["Global"]["tracker_checkpoints"]
    hooks: List[Hook] = []
    mlflow = mlflow_settings(config["Global"])
    if mlflow is not None:
        hooks.append(MLflowTracker(mlflow, checkpoints))
    wandb = wandb_settings(config)
    if wandb is not None:
        hooks.append(WandbTracker(wandb, checkpoints))
    return hooks


def config_hooks(config: Mapping[str, Any]) -> List[Hook]:
    """The user's hooks of ``Global.hooks: [{name: ..., key: value}, ...]`` (the ``HOOKS`` registry)."""
    entries = config["Global"]["hooks"] or []
    return [build_component(HOOKS, entry, config, f"Global.hooks[{i}]") for i, entry in enumerate(entries)]


def build_trainer(
    config: Dict[str, Any], env: Optional[DistEnv] = None, hooks: Sequence[Hook] = ()
) -> Trainer:
    """The trainer of a validated config, with ``hooks`` added to its own, resumed or initialised.
    ``env``: where this process sits (default: from the launch environment, ``init_distributed``).

    Like ``tools/train.py``: ``save_model_dir`` is claimed for this run before anything is written
    there (no silent overwrite of another run's checkpoints; released when training ends), and
    without a configured ``ppdist`` logger the run logs to the console and ``train.log``."""
    glob = config["Global"]
    check_capture_config(config)
    log_file = os.path.join(glob["save_model_dir"], "train.log")
    session = open_session(config, "training", log_file, claim=True, env=env, keep_logger=True)
    env, claim = session.env, session.claim
    device = env.device.type
    train_loader = build_dataloader(config, "Train", "train", env.rank, env.world_size, device)
    eval_loader = (
        build_dataloader(config, "Eval", "eval", env.rank, env.world_size, device)
        if config.get("Eval") and glob["eval_during_train"]
        else None
    )
    sampler = train_loader.batch_sampler
    steps_per_epoch = sampler.steps_per_epoch  # optimizer steps (micro-batches / Global.accumulate_steps)
    seed_everything(glob["seed"])  # identical initial weights on every rank
    input_sizes = loader_input_sizes(train_loader)
    runtime = build_runtime(glob, env.device, len(input_sizes))
    keep_freed_memory()  # each step frees and re-allocates its activations: reuse the pages
    model = place_model(build_model(config), glob, env)
    for loader in (train_loader, eval_loader):
        if loader is not None:  # an image under the model's smallest input is a named bad sample
            set_min_image_size(loader, min_input_size(model))
    loss_fn = build_loss(config)
    if isinstance(loss_fn, nn.Module):
        loss_fn.to(env.device)  # its buffers (class weights) live on the device
    postprocess, metric = build_postprocess(config), build_metric(config)
    train_metric = (postprocess, build_metric(config)) if glob["cal_metric_during_train"] else None
    optimizer, scheduler = build_optimizer(config, model, steps_per_epoch, sampler.samples_per_step)
    log_precision_hint(glob, env)
    ema = build_ema(model, glob)
    evaluator = runtime.evaluator(eval_loader, postprocess, metric, env) if eval_loader is not None else None
    writer = ScalarWriter(
        os.path.join(glob["save_model_dir"], "tensorboard")
        if env.is_main and (glob["use_tensorboard"] or glob["use_visualdl"])
        else None
    )
    trainer = Trainer(
        model,
        loss_fn,
        optimizer,
        scheduler,
        train_loader,
        total_steps=glob["max_iters"] or None,
        epochs=None if glob["max_iters"] else glob["epoch_num"],
        env=env,
        train_model=wrap_for_training(
            model, glob, env, input_size_count(train_loader) * (2 if sampler.accumulate_steps > 1 else 1)
        ),
        hooks=[
            RunDirRelease(claim),
            *default_hooks(config, evaluator, metric.main_indicator),
            *config_hooks(config),
            *hooks,
        ],
        autocast=runtime.autocast,
        update=build_weight_update(config, model, optimizer, scheduler, env, runtime.loss_scaling, ema=ema),
        channels_last=runtime.channels_last,
        train_metric=train_metric,
        writer=writer,
        background_checkpoints=glob["checkpoint_in_background"],
        save_dir=glob["save_model_dir"],
        config=config,
        classes=class_vocabulary(config),
        capture_step=glob["cuda_graph"],
    )
    if glob["cuda_graph"] and env.is_main:
        logger.info(
            "Global.cuda_graph: the training step is captured after %d eager steps and replayed%s",
            trainer.step_graph.eager_steps_left,
            "" if env.device.type == "cuda" else " op by op (no CUDA: the graph's semantics, not its speed)",
        )
    log_lr_scaling(glob, trainer, sampler)
    seed_everything(glob["seed"] + env.rank)  # per-rank streams (dropout, ...); a resume restores its own
    resume_or_initialize(trainer, config)
    if glob["cudnn_warmup"] == "all_sizes" and len(input_sizes) > 1:
        warmed = warm_training_sizes(trainer, config, input_sizes)
        if env.is_main:
            logger.info(
                "Global.cudnn_warmup: visited the %d training input sizes once in %.1f s",
                len(warmed["sizes"]),
                warmed["seconds"],
            )
    return trainer


def build_weight_update(
    config: Mapping[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    env: DistEnv,
    use_scaler: bool,
    ema: Optional[ModelEMA] = None,
    nan_policy: Any = "config",
) -> WeightUpdate:
    """The update policy of ``config``: its loss scaler (``use_scaler``: ``Runtime.loss_scaling``),
    ``ema``, gradient clipping and ``Global.nan_policy`` (or the ``nan_policy`` given)."""
    glob = config["Global"]
    return WeightUpdate(
        model,
        optimizer,
        scheduler,
        env=env,
        scaler=make_grad_scaler(glob, use_scaler, env.device),
        ema=ema,
        clip_gradients=gradient_clipper(config),
        nan_policy=glob["nan_policy"] if nan_policy == "config" else nan_policy,
    )


def log_precision_hint(glob: Mapping[str, Any], env: DistEnv) -> None:
    """On CUDA in fp32 (the originals' precision, ppdist's default): say what the GPU's full rate
    needs (docs/benchmarks.md has the measurements)."""
    if env.device.type == "cuda" and not glob["use_amp"] and env.is_main:
        logger.info(
            "training in fp32 (TF32 with float32_matmul_precision %s), as the original recipe; for a "
            "GPU's full rate use bf16 AMP (channels_last follows): -o Global.use_amp=true "
            "Global.amp_dtype=bfloat16",
            glob["float32_matmul_precision"],
        )


def log_lr_scaling(glob: Mapping[str, Any], trainer: Trainer, sampler: Any) -> None:
    base = auto_scale_lr_base(glob)
    if base is None:
        return
    factor = lr_factor(glob, sampler.samples_per_step)
    peak = trainer.scheduler.schedule.base_lr
    accumulate = int(glob.get("accumulate_steps") or 1)
    micro = f" x {accumulate} accumulated micro-batches" if accumulate > 1 else ""
    logger.info(
        "Global.auto_scale_lr: global batch %d (%d per process x %d process(es)%s) / base_batch_size %d "
        "-> learning rates x%.4g (peak %.6g -> %.6g)",
        sampler.samples_per_step,
        sampler.batch_size,
        trainer.env.world_size,
        micro,
        base,
        factor,
        peak / factor,
        peak,
    )
