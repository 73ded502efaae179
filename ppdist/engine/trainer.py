"""The shared training loop: one trainer for every task, no task-specific code.

Everything task-specific (model, loss, post-process, metric, dataset, transforms) is built
from the config; the loop only moves batches, steps the optimizer and the per-iteration
LR schedule, logs, evaluates and writes checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ppdist.components import build_loss, build_metric, build_model, build_postprocess
from ppdist.config import auto_scale_lr_base, compile_options, dump_config
from ppdist.data.base import BAD_SAMPLES_KEY
from ppdist.data.build import build_dataloader
from ppdist.engine import checkpoint as ckpt
from ppdist.engine.batch import batch_size_of, move_to_device
from ppdist.engine.dist import DistEnv, all_gather_object, all_reduce_sum
from ppdist.engine.ema import ModelEMA
from ppdist.engine.evaluator import Evaluator
from ppdist.engine.logger import ScalarWriter, SmoothedValues, format_train_line
from ppdist.engine.optim import build_optimizer, clip_gradients, needs_clipping, scale_learning_rates
from ppdist.errors import CheckpointError, ConfigError, DataError

logger = logging.getLogger("ppdist")
BAD_RATIO_MIN_SAMPLES = 200  # judge the bad-sample ratio only past this many samples


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6f}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in value) + "]"
    return str(value)


def format_metrics(values: Mapping[str, Any]) -> str:
    """``acc: 0.960000, norm_edit_dis: 0.991587, best_epoch: 6`` (floats to 6 decimals,
    per-class lists to 4)."""
    return ", ".join(f"{k}: {_format_value(v)}" for k, v in values.items())


def count_trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def make_autocast(glob: Mapping[str, Any], device: torch.device):
    """A zero-argument context factory for AMP (CUDA only) and whether fp16 scaling is needed."""
    if not glob["use_amp"]:
        return contextlib.nullcontext, False
    if device.type != "cuda":
        logger.warning("Global.use_amp is set but training runs on CPU: AMP is disabled")
        return contextlib.nullcontext, False
    dtype = torch.bfloat16 if glob["amp_dtype"] == "bfloat16" else torch.float16
    return (lambda: torch.autocast("cuda", dtype=dtype)), dtype == torch.float16


def gradient_as_bucket_view(glob: Mapping[str, Any], device: torch.device) -> bool:
    """``Global.gradient_as_bucket_view``; unset: on with CUDA, off on CPU, where gloo DDP steps
    measured slower with it (docs/benchmarks.md)."""
    setting = glob["gradient_as_bucket_view"]
    return device.type == "cuda" if setting is None else bool(setting)


class Trainer:
    """Builds the run from a validated config and trains it (``train()``)."""

    def __init__(self, config: Dict[str, Any], env: DistEnv) -> None:
        self.config = config
        self.env = env
        self.glob = glob = config["Global"]
        self.save_dir = glob["save_model_dir"]
        self.train_loader = build_dataloader(
            config, "Train", "train", env.rank, env.world_size, env.device.type
        )
        self.eval_loader = (
            build_dataloader(config, "Eval", "eval", env.rank, env.world_size, env.device.type)
            if config.get("Eval")
            else None
        )
        self.steps_per_epoch = len(self.train_loader)
        sampler = self.train_loader.batch_sampler
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"the training set has {sampler.dataset_len} samples: not one full batch of "
                f"{sampler.batch_size} per process x {env.world_size} process(es) with drop_last"
            )
        if glob["max_iters"]:
            self.total_steps = int(glob["max_iters"])
            self.epoch_num = math.ceil(self.total_steps / self.steps_per_epoch)
        else:
            self.epoch_num = int(glob["epoch_num"])
            self.total_steps = self.epoch_num * self.steps_per_epoch

        seed_everything(glob["seed"])  # identical initial weights on every rank
        self.model = build_model(config).to(env.device)
        if glob["channels_last"]:
            self.model = self.model.to(memory_format=torch.channels_last)
        if glob["use_sync_bn"] and env.distributed:
            if env.device.type == "cuda":
                self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
            else:
                logger.warning("Global.use_sync_bn needs CUDA; BatchNorm stays per-process on CPU")
        self.loss_fn = build_loss(config)
        self.postprocess = build_postprocess(config)
        self.metric = build_metric(config)
        self.train_metric = build_metric(config) if glob["cal_metric_during_train"] else None
        base_batch = auto_scale_lr_base(glob)
        self.lr_factor = sampler.samples_per_step / base_batch if base_batch else 1.0
        opt_cfg = config["Optimizer"]
        if base_batch:
            opt_cfg = dict(opt_cfg, lr=scale_learning_rates(opt_cfg["lr"], self.lr_factor))
        self.optimizer, self.scheduler = build_optimizer(
            opt_cfg, self.model, self.epoch_num, self.steps_per_epoch, self.total_steps
        )
        self.autocast, use_scaler = make_autocast(glob, env.device)
        self.scaler = torch.amp.GradScaler(
            "cuda",
            enabled=use_scaler,
            init_scale=float(glob["scale_loss"]),
            growth_interval=2000 if glob["use_dynamic_loss_scaling"] else 10**9,
        )
        self.ema = (
            ModelEMA(
                self.model, decay=glob["ema_decay"], use_thres_step=glob["ema_decay_type"] == "threshold"
            )
            if glob["use_ema"]
            else None
        )
        self.evaluator = (
            Evaluator(
                self.eval_loader, self.postprocess, self.metric, env, self.autocast, glob["channels_last"]
            )
            if self.eval_loader is not None
            else None
        )
        self.main_indicator = self.metric.main_indicator

        # position: epoch ``next_epoch`` continues after its first ``epoch_consumed`` samples
        # (all ranks together), i.e. with its batch ``next_batch`` under this run's layout
        self.next_epoch, self.next_batch, self.epoch_consumed, self.global_step = 1, 0, 0, 0
        self.best: Dict[str, Any] = {}
        self.last_eval_step = -1
        self._load_initial_weights()
        seed_everything(glob["seed"] + env.rank)  # per-rank stream for dropout etc.
        if self._resume_rng is not None:
            ckpt.restore_rng_state(self._resume_rng)

        self.ddp_model: nn.Module = self.model
        if env.distributed:
            self.ddp_model = DistributedDataParallel(
                self.model,
                device_ids=[env.device.index] if env.device.type == "cuda" else None,
                gradient_as_bucket_view=gradient_as_bucket_view(glob, env.device),
                static_graph=glob["static_graph"],
                bucket_cap_mb=glob["bucket_cap_mb"],
                find_unused_parameters=glob["find_unused_parameters"],
            )
        options = compile_options(glob)
        if options is not None:  # the training forward only; checkpoints and eval use self.model
            logger.info(
                "Global.compile: torch.compile(%s)", ", ".join(f"{k}={v!r}" for k, v in options.items())
            )
            self.ddp_model = torch.compile(self.ddp_model, **options)
        # called after every optimizer step with {global_step, samples, reader_cost, batch_cost}
        self.step_listeners: List[Callable[[Dict[str, float]], None]] = []
        self.writer = ScalarWriter(
            os.path.join(self.save_dir, "tensorboard")
            if env.is_main and (glob["use_tensorboard"] or glob["use_visualdl"])
            else None
        )

    # ------------------------------------------------------------------ state
    def _load_initial_weights(self) -> None:
        self._resume_rng = None
        found = self._find_resume_state()
        if found is not None:
            self.load_state_dict(*found)
        elif ckpt.load_initial_weights(self.model, self.config):
            if self.ema is not None:  # the average starts from the pretrained weights
                self.ema.module.load_state_dict(self.model.state_dict())

    def _find_resume_state(self) -> Optional[Tuple[Dict[str, Any], str]]:
        """The checkpoint to resume from (``auto``: ``latest`` if any process has one)."""
        path = self.glob["checkpoints"]
        if not path:
            return None
        auto = path == "auto"
        if auto:
            path = os.path.join(self.save_dir, "latest" + ckpt.SUFFIX)
        found = ckpt.load_across_ranks(path, self.env, missing_ok=auto)
        if found is None:
            logger.info("Global.checkpoints is 'auto' and %s does not exist: starting a new run", path)
        return found

    def state_dict(self, rng_states: Any) -> Dict[str, Any]:
        """Everything needed to continue this run exactly."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "ema": self.ema.state_dict() if self.ema else None,
            "next_epoch": self.next_epoch,
            "next_batch": self.next_batch,
            "epoch_consumed": self.epoch_consumed,
            "dataset_len": self.train_loader.batch_sampler.dataset_len,
            "batch_size_per_card": self.train_loader.batch_sampler.batch_size,
            "global_step": self.global_step,
            "steps_per_epoch": self.steps_per_epoch,
            "best": dict(self.best),
            "last_eval_step": self.last_eval_step,
            "rng": rng_states,
            "world_size": self.env.world_size,
            "config": self.config,
        }

    def load_state_dict(self, state: Mapping[str, Any], source: str) -> None:
        """Resume from a checkpoint written by ``state_dict`` (the same or, with
        ``Global.auto_scale_lr``, another number of processes or batch size)."""
        if "optimizer" not in state or "next_epoch" not in state:
            raise CheckpointError(
                f"{source} holds weights only; use Global.pretrained_model to start from it"
            )
        sampler = self.train_loader.batch_sampler
        saved_len = state.get("dataset_len")
        if saved_len is not None and saved_len != sampler.dataset_len:
            raise CheckpointError(
                f"{source} was taken with a training set of {saved_len} samples and this run has "
                f"{sampler.dataset_len}; resume with the same data (or start a new run from it "
                f"with Global.pretrained_model)"
            )
        same_layout = (
            state["world_size"] == self.env.world_size
            and state["steps_per_epoch"] == self.steps_per_epoch
            and state.get("batch_size_per_card", sampler.batch_size) == sampler.batch_size
        )
        if not same_layout:
            self._check_relayout_allowed(state, source)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state.get("ema"):
            self.ema.load_state_dict(state["ema"])
        self.next_epoch, self.next_batch = int(state["next_epoch"]), int(state["next_batch"])
        self.epoch_consumed = int(state.get("epoch_consumed", self.next_batch * sampler.samples_per_step))
        self.global_step = int(state["global_step"])
        self.best = dict(state.get("best") or {})
        self.last_eval_step = int(state.get("last_eval_step", -1))
        if not same_layout:
            self._map_position(state)
        rng = state.get("rng") or []
        self._resume_rng = rng[self.env.rank] if same_layout and len(rng) == self.env.world_size else None
        logger.info(
            "resumed from %s: epoch %d, batch %d, global_step %d, best %s",
            source,
            self.next_epoch,
            self.next_batch,
            self.global_step,
            self.best or "-",
        )

    def _check_relayout_allowed(self, state: Mapping[str, Any], source: str) -> None:
        """A resume with another world size or batch needs auto_scale_lr and the sample position."""
        batch = self.train_loader.batch_sampler.batch_size
        if state["world_size"] != self.env.world_size:
            change = (
                f"{source} was written by a run with {state['world_size']} process(es) and this run has "
                f"{self.env.world_size}"
            )
        elif state.get("batch_size_per_card", batch) != batch:
            change = (
                f"{source} was written with batch_size_per_card {state['batch_size_per_card']} and this run "
                f"has {batch}"
            )
        else:
            change = (
                f"{source}: the training set gives {self.steps_per_epoch} batches per epoch but the "
                f"checkpoint was taken with {state['steps_per_epoch']}; the data or batch size changed"
            )
        if auto_scale_lr_base(self.glob) is None:
            raise CheckpointError(
                f"{change}; resume with the same number of processes and batch size, or set "
                f"Global.auto_scale_lr: {{base_batch_size: N}} to continue with the new layout "
                f"(learning rate rescaled, the epoch continues where it stopped), or start a new "
                f"run from it with Global.pretrained_model"
            )
        if "epoch_consumed" not in state or "dataset_len" not in state:
            raise CheckpointError(
                f"{change}, and the checkpoint does not record its sample position (written by an "
                f"older ppdist); resume it with its original layout"
            )

    def _map_position(self, state: Mapping[str, Any]) -> None:
        """Continue the checkpoint's epoch from the same sample with this run's layout.

        Epoch-based runs restart the step count of the epoch so that it ends exactly at
        ``epoch * steps_per_epoch``; iteration-based runs keep their step count (max_iters).
        """
        sampler = self.train_loader.batch_sampler
        sampler.set_epoch(self.next_epoch)
        sampler.set_position(self.epoch_consumed)
        left = sampler.remaining_batches()
        self.next_batch = self.steps_per_epoch - left
        old_step = self.global_step
        if not self.glob["max_iters"]:
            self.global_step = (self.next_epoch - 1) * self.steps_per_epoch + self.next_batch
        self.scheduler.load_state_dict({"last_step": self.global_step})
        logger.warning(
            "resuming a run of %d process(es) x %d per process with %d x %d (Global.auto_scale_lr): "
            "epoch %d continues after %d of %d samples with %d batch(es) left; global_step %d -> %d; "
            "learning rate x%.4g of the configured one",
            state["world_size"],
            state.get("batch_size_per_card", 0),
            self.env.world_size,
            sampler.batch_size,
            self.next_epoch,
            self.epoch_consumed,
            sampler.dataset_len,
            left,
            old_step,
            self.global_step,
            self.lr_factor,
        )

    def save(self, name: str, extra: Optional[Mapping[str, Any]] = None) -> None:
        """Collect every rank's RNG state, then rank 0 writes ``<name>.pt`` atomically."""
        self._sync_buffers()
        rng_states = all_gather_object(ckpt.capture_rng_state(), self.env)
        if self.env.is_main:
            state = self.state_dict(rng_states)
            state.update(extra or {})
            path = os.path.join(self.save_dir, name + ckpt.SUFFIX)
            ckpt.save_atomic(state, path)
            logger.info("saved %s", path)

    def _sync_buffers(self) -> None:
        """Rank 0's BatchNorm statistics everywhere, so evaluated == saved model."""
        if self.env.distributed:
            import torch.distributed as dist

            for buffer in self.model.buffers():
                dist.broadcast(buffer.data, src=0)

    # ------------------------------------------------------------------ evaluation
    def eval_model(self) -> nn.Module:
        return self.ema.module if self.ema is not None else self.model

    def evaluate(self, epoch: int) -> Dict[str, float]:
        assert self.evaluator is not None
        self._sync_buffers()
        metrics = self.evaluator.run(self.eval_model(), desc=f"eval step {self.global_step}")
        self.last_eval_step = self.global_step
        logger.info("cur metric, %s, fps: %.2f", format_metrics(metrics), self.evaluator.last_fps)
        self.writer.add_scalars("eval", metrics, self.global_step)
        current = metrics[self.main_indicator]
        if not self.best or current >= self.best[self.main_indicator]:
            self.best = dict(metrics, best_epoch=epoch, best_step=self.global_step)
            self.save("best_accuracy", {"metrics": metrics})
        logger.info("best metric, %s", format_metrics(self.best))
        return metrics

    def _should_eval(self, epoch: int, epoch_end: bool) -> bool:
        if self.evaluator is None or self.last_eval_step == self.global_step:
            return False
        if self.glob["eval_batch_epoch"]:
            return epoch_end and epoch % self.glob["eval_batch_epoch"] == 0
        start, interval = self.glob["eval_batch_step"]
        return self.global_step > start and (self.global_step - start) % interval == 0

    # ------------------------------------------------------------------ training
    def _step(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        with self.autocast():
            preds = self.ddp_model(batch)
            losses = self.loss_fn(preds, batch)
        loss = losses["loss"]
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if needs_clipping(self.config["Optimizer"], self.glob["grad_clip"]):
            self.scaler.unscale_(self.optimizer)
            clip_gradients(self.model, self.config["Optimizer"], self.glob["grad_clip"])
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model)
        # detached tensors, turned into floats only when logged (no device sync per step)
        values: Dict[str, Any] = {
            k: v.detach() for k, v in losses.items() if isinstance(v, torch.Tensor) and v.numel() == 1
        }
        if self.train_metric is not None and self.env.is_main:
            self.train_metric.reset()
            self.train_metric.update(
                self.postprocess(preds.detach() if isinstance(preds, torch.Tensor) else preds, batch), batch
            )
            values.update(self.train_metric.compute())
        return values

    def _check_bad_ratio(self, bad: int, seen: int, final: bool) -> None:
        bad_total, seen_total = (int(v) for v in all_reduce_sum([bad, seen], self.env))
        limit = float(self.glob["max_bad_sample_ratio"])
        if seen_total and (final or seen_total >= BAD_RATIO_MIN_SAMPLES) and bad_total / seen_total > limit:
            raise DataError(
                f"{bad_total} of {seen_total} training samples this epoch were bad "
                f"({bad_total / seen_total:.1%} > Global.max_bad_sample_ratio {limit:.1%}); "
                f"fix the data (see the warnings above) or raise the limit"
            )
        if final and bad_total:
            logger.warning(
                "epoch summary: %d bad training sample(s) of %d were skipped and replaced",
                bad_total,
                seen_total,
            )

    def train(self) -> Dict[str, Any]:
        """Run to the end of the schedule; returns the best metrics."""
        glob, env = self.glob, self.env
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        if env.is_main:
            dump_config(self.config, os.path.join(self.save_dir, "config.yml"))
            logger.info("trainable parameters: %s", f"{count_trainable(self.model):,}")
            logger.info(
                "%d process(es), device %s, %d batches/epoch per process, %d epochs, %d steps",
                env.world_size,
                env.device,
                self.steps_per_epoch,
                self.epoch_num,
                self.total_steps,
            )
            self._log_lr_scaling()
            if restarts:
                logger.warning(
                    "torchrun restart %d (of at most %s): continuing at epoch %d, batch %d, global_step %d",
                    restarts,
                    os.environ.get("TORCHELASTIC_MAX_RESTARTS", "?"),
                    self.next_epoch,
                    self.next_batch,
                    self.global_step,
                )
        smoothed = SmoothedValues(glob["log_smooth_window"])
        sampler = self.train_loader.batch_sampler
        processes = env.world_size
        save_every = glob["save_iter_step"]
        run_start, steps_run = time.perf_counter(), 0
        epoch = self.next_epoch
        while self.global_step < self.total_steps:
            sampler.set_epoch(epoch)
            start_consumed = self.epoch_consumed if epoch == self.next_epoch else 0
            sampler.set_position(start_consumed)
            batches_left = sampler.remaining_batches()
            first_batch = self.steps_per_epoch - batches_left
            self.ddp_model.train()
            bad = seen = 0
            reader_sum = batch_sum = samples_sum = 0.0
            window_steps = 0
            finished_epoch = True
            tick = time.perf_counter()
            for offset, batch in enumerate(self.train_loader):
                reader_cost = time.perf_counter() - tick
                bad_here = batch.pop(BAD_SAMPLES_KEY, [])
                for line in bad_here:
                    logger.warning("bad training sample replaced: %s", line)
                size = batch_size_of(batch)
                bad += len(bad_here)
                seen += size
                batch = move_to_device(batch, env.device, glob["channels_last"])
                batch["epoch_id"] = (
                    epoch - 1
                )  # 0-based, for epoch-dependent losses (PP-YOLOE's assigner switch)
                values = self._step(batch)
                self.global_step += 1
                epoch_done = offset + 1 >= batches_left
                if epoch_done:
                    self.next_epoch, self.next_batch, self.epoch_consumed = epoch + 1, 0, 0
                else:
                    self.next_epoch, self.next_batch = epoch, first_batch + offset + 1
                    self.epoch_consumed = start_consumed + (offset + 1) * sampler.samples_per_step
                smoothed.update(values)
                batch_cost = time.perf_counter() - tick
                reader_sum, batch_sum, samples_sum = (
                    reader_sum + reader_cost,
                    batch_sum + batch_cost,
                    samples_sum + size * processes,
                )
                window_steps += 1
                steps_run += 1
                for listener in self.step_listeners:
                    listener(
                        {
                            "global_step": self.global_step,
                            "samples": size * processes,
                            "reader_cost": reader_cost,
                            "batch_cost": batch_cost,
                        }
                    )
                if (
                    self.global_step % glob["print_batch_step"] == 0
                    or epoch_done
                    or self.global_step >= self.total_steps
                ):
                    self._check_bad_ratio(bad, seen, final=False)
                    mean_cost = (time.perf_counter() - run_start) / steps_run
                    line = format_train_line(
                        epoch,
                        self.epoch_num,
                        self.global_step,
                        self.scheduler.get_lr(),
                        smoothed.medians(),
                        reader_sum / window_steps,
                        batch_sum / window_steps,
                        samples_sum / window_steps,
                        (self.total_steps - self.global_step) * mean_cost,
                        self._memory_info(),
                    )
                    logger.info(line)
                    self.writer.add_scalars(
                        "train", dict(smoothed.medians(), lr=self.scheduler.get_lr()), self.global_step
                    )
                    reader_sum = batch_sum = samples_sum = 0.0
                    window_steps = 0
                if self._should_eval(epoch, epoch_end=False):
                    self.evaluate(epoch)
                if self.global_step >= self.total_steps:
                    finished_epoch = epoch_done
                    break
                if save_every and self.global_step % save_every == 0 and not epoch_done:
                    self.save("latest")
                tick = time.perf_counter()
            if finished_epoch:  # also when a re-laid-out resume left no batch in this epoch
                self.next_epoch, self.next_batch, self.epoch_consumed = epoch + 1, 0, 0
            self._check_bad_ratio(bad, seen, final=True)
            if self._should_eval(epoch, epoch_end=True):
                self.evaluate(epoch)
            self.save("latest")
            if epoch % glob["save_epoch_step"] == 0:
                self.save(f"iter_epoch_{epoch}")
            epoch += 1
        if self.evaluator is not None and self.last_eval_step != self.global_step:
            self.evaluate(self.next_epoch if self.next_batch else self.next_epoch - 1)
            self.save("latest")
        self.writer.close()
        if env.is_main:
            logger.info(
                "training finished: %d steps%s, best %s",
                self.global_step,
                f" ({restarts} torchrun restart(s))" if restarts else "",
                format_metrics(self.best) or "-",
            )
        return self.best

    def _log_lr_scaling(self) -> None:
        if auto_scale_lr_base(self.glob) is None:
            return
        sampler = self.train_loader.batch_sampler
        peak = self.scheduler.schedule.base_lr
        logger.info(
            "Global.auto_scale_lr: global batch %d (%d per process x %d) / base_batch_size %d -> learning "
            "rates x%.4g (peak %.6g -> %.6g)",
            sampler.samples_per_step,
            sampler.batch_size,
            self.env.world_size,
            auto_scale_lr_base(self.glob),
            self.lr_factor,
            peak / self.lr_factor,
            peak,
        )

    def _memory_info(self) -> str:
        if self.env.device.type != "cuda" or not self.glob["print_mem_info"]:
            return ""
        reserved = torch.cuda.max_memory_reserved(self.env.device) / 2**20
        allocated = torch.cuda.max_memory_allocated(self.env.device) / 2**20
        return f"max_mem_reserved: {reserved:.0f} MB, max_mem_allocated: {allocated:.0f} MB"
