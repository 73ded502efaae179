"""The shared training loop: one short loop for every task, everything else in hooks.

The trainer runs the parts it is given — model, loss, optimizer, LR schedule, data loader, and
optionally AMP, EMA, gradient clipping — step after step from where its ``RunPosition`` stands,
and calls its hooks around each step (``ppdist.engine.hooks.base``). It builds nothing: see
``ppdist.engine.setup.build_trainer`` for the parts of a config, or pass your own objects.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import torch
from torch import nn

from ppdist.engine import checkpoint as ckpt
from ppdist.engine.amp import load_scaler_state
from ppdist.engine.batch import detach, move_to_device
from ppdist.engine.checkpoint.background import BackgroundWriter
from ppdist.engine.checkpoint.resumable import check_resumable
from ppdist.engine.dist import DistEnv, all_gather_object, broadcast_tensors
from ppdist.engine.ema import ModelEMA
from ppdist.engine.finite_state import describe, model_state, nonfinite_tensors
from ppdist.engine.hooks.base import Hook
from ppdist.engine.logger import ScalarWriter
from ppdist.engine.nonfinite import NonFiniteError, NonFiniteWatch, last_good_text
from ppdist.engine.position import Layout, RunPosition, run_length
from ppdist.engine.prefetch import DevicePrefetcher
from ppdist.engine.step_batches import step_batches
from ppdist.engine.step_graph import StepGraph
from ppdist.engine.step_record import StepRecord
from ppdist.engine.update import WeightUpdate
from ppdist.errors import ConfigError
from ppdist.losses.normalizer import NORMALIZER_KEY
from ppdist.modeling.batch_norm import store_true_variances
from ppdist.utils.rng import capture_rng_state, restore_rng_state

logger = logging.getLogger("ppdist")


class Trainer:
    """Trains ``model`` on ``train_loader`` for ``total_steps`` optimizer steps, or ``epochs`` epochs.

    ``train_loader`` is a DataLoader whose batch sampler is ppdist's ``TrainBatchSampler`` (what
    ``ppdist.build_dataloader`` gives): the run's position is a place in its epochs. ``model(batch)``
    gives the predictions and ``loss_fn(preds, batch)`` a dict with the scalar ``loss`` and any
    other terms to log; ``scheduler`` is stepped once per step (``ppdist.build_optimizer`` gives
    one; a torch LR scheduler works too, except for resuming with another layout).

    ``train_model`` is what the forward pass calls (the DDP and/or compiled wrapper of ``model``;
    ``model`` itself is what is saved and evaluated). ``autocast`` is a zero-argument context
    factory for the forward pass (the loss always runs outside it, in fp32); ``update`` is the
    update policy (``WeightUpdate``: loss scaler, clipping, non-finite watch, optimizer and LR
    steps, EMA; a plain optimizer step by default). ``train_metric`` = (post-process,
    metric) computes the metric of a training batch for the log lines (``train_metric_values``).
    Batch entries named in the loss's ``host_keys`` (e.g. CTC's label lengths) stay on the host.
    ``classes`` (``ppdist.components.class_vocabulary``: what the outputs mean, a recognition
    model's dictionary) is written into every checkpoint, and a resume with other classes is refused.

    With a sampler that accumulates (``TrainBatchSampler(accumulate_steps=K)``) each optimizer
    step is ``K`` micro-batches: DDP syncs gradients on the last only, and the gradient is that
    of the ``N * K`` processes the step stands for (``ppdist.losses.normalizer``). The update's
    ``nan_policy`` keeps the non-finite record of ``ppdist.engine.nonfinite``: ``save`` refuses to write over a good checkpoint after a non-finite step, and ``save`` and the
    evaluation refuse a model with a NaN/Inf weight or buffer whatever the policy (``check_state_finite``).

    A step reads no value on the host (the GPU never waits): loss terms stay tensors until a hook
    logs them. ``capture_step`` (``Global.cuda_graph``) captures the whole step after a few eager
    ones and replays it (``ppdist.engine.step_graph``): one batch per step, a fused optimizer
    (``WeightUpdate.capture_ready``), inputs of one shape.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., Mapping[str, Any]],
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        train_loader: Iterable[Dict[str, Any]],
        *,
        total_steps: Optional[int] = None,
        epochs: Optional[int] = None,
        env: Optional[DistEnv] = None,
        train_model: Optional[nn.Module] = None,
        hooks: Sequence[Hook] = (),
        autocast: Callable[[], Any] = contextlib.nullcontext,
        update: Optional[WeightUpdate] = None,
        channels_last: bool = False,
        train_metric: Optional[Sequence[Any]] = None,
        writer: Optional[ScalarWriter] = None,
        save_dir: Optional[str] = None,
        config: Optional[Mapping[str, Any]] = None,
        classes: Optional[Mapping[str, Any]] = None,
        background_checkpoints: bool = True,
        capture_step: bool = False,
    ) -> None:
        self.model, self.loss_fn, self.optimizer, self.scheduler = model, loss_fn, optimizer, scheduler
        self.train_loader = train_loader
        self.sampler = getattr(train_loader, "batch_sampler", None)
        if not all(
            hasattr(self.sampler, a)
            for a in ("dataset_len", "set_epoch", "set_position", "remaining_batches")
        ):
            raise TypeError(
                "train_loader needs ppdist's TrainBatchSampler as its batch_sampler (ppdist.build_dataloader "
                f"gives one; got {type(self.sampler).__name__}): the run's position is a place in its epochs"
            )
        self.env = env or DistEnv()
        self.train_model = train_model if train_model is not None else model
        self.autocast = autocast
        if update is None:  # a plain optimizer step: no scaler, clipping, EMA or non-finite watch
            update = WeightUpdate(model, optimizer, scheduler, env=self.env)
        update.check_built_for(model, optimizer, scheduler)
        self.update = update
        self.normalizer_floor = float(getattr(loss_fn, "normalizer_floor", 0.0))  # ppdist.losses.normalizer
        self.channels_last, self.train_metric = channels_last, train_metric
        self.host_keys = tuple(getattr(loss_fn, "host_keys", ()))
        self.last_good: Optional[Tuple[str, int]] = None  # the last checkpoint written: (path, global_step)
        self.writer = writer or ScalarWriter(None)
        self.save_dir, self.config = save_dir, config
        self.classes = dict(classes) if classes else None  # what the outputs mean (checkpoint.classes)
        self.checkpoint_writer = BackgroundWriter(
            background=background_checkpoints
        )  # rank 0's checkpoint files, off the step's path
        layout = Layout.of(self.sampler)
        self.step_graph = (
            StepGraph.for_training(
                self._captured_body, model, update, self.env, layout.accumulate_steps, autocast
            )
            if capture_step
            else None
        )
        if layout.steps_per_epoch == 0:
            raise ConfigError(
                f"the training set has {layout.dataset_len} samples: not one full batch of {layout.batch_size} "
                f"per process x {layout.world_size} process(es) with drop_last"
            )
        if (total_steps is None) == (epochs is None):
            raise ValueError("give the length of the schedule: total_steps or epochs (one of the two)")
        self.epoch_num, self.total_steps = run_length(epochs, total_steps, layout.steps_per_epoch)
        self.position = RunPosition(layout, iteration_based=total_steps is not None)
        self.epoch, self.epoch_done = self.position.next_epoch, False
        self.last_step: Optional[StepRecord] = None
        self.stop_reason: Optional[str] = None
        self.hooks: List[Hook] = []
        self._pending_hook_states: Dict[str, Any] = {}
        self.register_hooks(hooks)

    # ------------------------------------------------------------------ the loop
    def train(self) -> Dict[str, Any]:
        """Run to the end of the schedule; returns the hooks' summaries (e.g. the best metrics).
        When it stops on an exception, the hooks' ``after_failure`` runs instead of ``after_train``."""
        try:
            self._call_hooks("before_train")
            while not self.finished:
                self._train_epoch()
            self._call_hooks("after_train", reverse=True)
            self.checkpoint_writer.close()
        except BaseException:
            try:
                self._call_hooks("after_failure", reverse=True)
            finally:  # what was saved before the failure is whole when the exception propagates
                self.checkpoint_writer.close(raise_error=False)
            raise
        self.writer.close()
        return self.summary()

    def _train_epoch(self) -> None:
        self.epoch = self.position.next_epoch
        self.position.enter_epoch(self.sampler)
        self.train_model.train()
        # on CUDA the next batch's copy to the device overlaps with the current step
        micro_batches = DevicePrefetcher.for_device(self.train_loader, self.to_device, self.env.device)
        tick = time.perf_counter()
        for batch in micro_batches:  # the first micro-batch of a step; run_step takes the others
            reader_cost = time.perf_counter() - tick
            self.checkpoint_writer.poll()  # a background write that ended: its error or its log line
            self._call_hooks("before_step")
            self.last_step = self.run_step(batch, reader_cost, tick, micro_batches)
            self._call_hooks("after_step")
            if self.finished:
                break
            tick = time.perf_counter()
        if self.position.next_epoch == self.epoch and not self.finished:
            self.position.finish_epoch()  # a re-laid-out resume that left no batch in this epoch
        self._call_hooks("after_epoch")

    def run_step(
        self,
        batch: Dict[str, Any],
        reader_cost: float,
        tick: float,
        more_batches: Optional[Iterator[Dict[str, Any]]] = None,
    ) -> StepRecord:
        """Take one optimizer step on ``batch`` and, with gradient accumulation, the next
        ``accumulate_steps - 1`` micro-batches of ``more_batches`` (each moved to the device as it
        arrives), then advance the position."""
        count = self.position.layout.accumulate_steps
        record = StepRecord({}, 0, 0, reader_cost, 0.0)
        micro_batches = step_batches(batch, more_batches, count, record, self.to_device, self.epoch - 1)
        values, preds = self._optimizer_step(micro_batches, count)
        self.epoch_done = self.position.advance()
        record.values, record.samples = values, record.local_samples * self.env.world_size
        record.batch_cost = time.perf_counter() - tick
        if self.train_metric is None:
            record.batch = None
        else:
            record.preds = preds
        return record

    def to_device(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """``batch``'s tensors on the training device (non-blocking), but the loss's ``host_keys``."""
        return move_to_device(batch, self.env.device, self.channels_last, keep_on_host=self.host_keys)

    def step(self, batch: Dict[str, Any], *more: Dict[str, Any]) -> Tuple[Dict[str, Any], Any]:
        """One optimizer step on ``batch`` (already on the device) and, for gradient accumulation,
        the other micro-batches ``more``: the loss terms as detached tensors (read only when
        logged; the mean over the micro-batches) and the detached predictions (of the last)."""
        batches = (batch, *more)
        return self._optimizer_step(iter(batches), len(batches))

    def _optimizer_step(
        self, micro_batches: Iterator[Dict[str, Any]], count: int
    ) -> Tuple[Dict[str, Any], Any]:
        """The step eagerly, or through the captured step (``Global.cuda_graph``), which leaves
        the LR schedule to the host after it."""
        if self.step_graph is None:
            return self._eager_step(micro_batches, count, self.position.global_step + 1)
        self.step_graph.set_step(self.position.global_step + 1)
        values, preds = self.step_graph.run(next(micro_batches))
        self.scheduler.step()
        return values, detach(preds)

    def _captured_body(self, batch: Dict[str, Any]) -> Tuple[Dict[str, Any], Any]:
        """What the captured step records: the eager step of one batch, the global step read
        from the graph's device counter."""
        assert self.step_graph is not None
        return self._eager_step(iter((batch,)), 1, self.step_graph.step_number)

    def _eager_step(
        self, micro_batches: Iterator[Dict[str, Any]], count: int, next_step: Union[int, torch.Tensor]
    ) -> Tuple[Dict[str, Any], Any]:
        """Forward and backward of each micro-batch (DDP syncs gradients on the last only), then
        the update (``WeightUpdate``: the gradient of their average, optimizer, LR schedule, EMA)."""
        self.update.begin()
        terms: List[Dict[str, torch.Tensor]] = []
        normalizers: List[torch.Tensor] = []
        preds: Any = None
        for index, batch in enumerate(micro_batches):
            with self._gradient_sync(index == count - 1):
                with self.autocast():
                    preds = self.train_model(batch)
                losses = self.loss_fn(preds, batch)
                normalizer = self.update.backward(losses, count, self.normalizer_floor)
            if normalizer is not None:
                normalizers.append(normalizer)
            terms.append(
                {
                    k: v.detach()
                    for k, v in losses.items()
                    if k != NORMALIZER_KEY and isinstance(v, torch.Tensor) and v.numel() == 1
                }
            )
        values = terms[0] if count == 1 else {k: torch.stack([t[k] for t in terms]).mean() for k in terms[0]}
        self.update.apply(values, normalizers, count, next_step, self.normalizer_floor)
        return values, detach(preds)

    def _gradient_sync(self, enabled: bool) -> ContextManager[Any]:
        """DDP's ``no_sync`` while accumulating (gradients are all-reduced with the last micro-batch)."""
        if enabled:
            return contextlib.nullcontext()
        module = getattr(self.train_model, "_orig_mod", self.train_model)  # under torch.compile
        no_sync = getattr(module, "no_sync", None)
        return no_sync() if no_sync is not None else contextlib.nullcontext()

    def train_metric_values(self, record: StepRecord) -> Dict[str, Any]:
        """The training metric of ``record``'s batch (empty without ``train_metric`` or its
        predictions); called by the log hook on its log steps only, as it reads the device."""
        if self.train_metric is None or record.preds is None or record.batch is None:
            return {}
        postprocess, metric = self.train_metric
        metric.reset()
        metric.update(postprocess(record.preds, record.batch), record.batch)
        return dict(metric.compute())

    @property
    def scaler(self) -> torch.amp.GradScaler:
        return self.update.scaler

    @property
    def ema(self) -> Optional[ModelEMA]:
        return self.update.ema

    @property
    def nonfinite(self) -> Optional[NonFiniteWatch]:
        return self.update.nonfinite

    @property
    def finished(self) -> bool:
        """The schedule is done, or a hook asked to stop (``request_stop``)."""
        return self.stop_reason is not None or self.position.global_step >= self.total_steps

    def request_stop(self, reason: str) -> None:
        """End the run after the current step's hooks (early stopping, a profiler window that
        exits): the loop then runs ``after_epoch`` and ``after_train`` as at the schedule's end.
        A hook that asks must ask on every process at the same step (e.g. from a value every
        process computed alike) and keep its decision in its state, so that a resumed run stops too."""
        if self.stop_reason is None:
            self.stop_reason = reason
            logger.info("stopping at global_step %d: %s", self.position.global_step, reason)

    def current_lr(self) -> float:
        """The learning rate of the next step (ppdist's ``IterScheduler`` or a torch LR scheduler)."""
        if hasattr(self.scheduler, "get_last_lr"):
            return float(self.scheduler.get_last_lr()[0])
        return float(self.scheduler.get_lr())

    # ------------------------------------------------------------------ hooks
    def register_hooks(self, hooks: Iterable[Hook]) -> None:
        """Add hooks (kept sorted by priority, ties in the order added); a resumed state waiting
        for a hook of that name is loaded into it."""
        for hook in hooks:
            if any(other.hook_name == hook.hook_name for other in self.hooks):
                raise ConfigError(f"two hooks are named {hook.hook_name!r}: give one another name")
            hook.trainer = self
            if hook.hook_name in self._pending_hook_states:
                hook.load_state_dict(self._pending_hook_states.pop(hook.hook_name))
            self.hooks.append(hook)
        self.hooks.sort(key=lambda hook: hook.priority)

    def hook(self, name: str) -> Hook:
        for hook in self.hooks:
            if hook.hook_name == name:
                return hook
        raise KeyError(f"no hook named {name!r} (hooks: {[h.hook_name for h in self.hooks]})")

    def _call_hooks(self, stage: str, reverse: bool = False) -> None:
        for hook in reversed(self.hooks) if reverse else self.hooks:
            getattr(hook, stage)()

    def summary(self) -> Dict[str, Any]:
        result: Dict[str, Any] = {}
        for hook in self.hooks:
            result.update(hook.summary())
        return result

    # ------------------------------------------------------------------ models
    def eval_model(self) -> nn.Module:
        """What evaluation and export use: the EMA average when kept."""
        return self.ema.module if self.ema is not None else self.model

    def sync_buffers(self) -> None:
        """Rank 0's BatchNorm statistics (of the model and of its EMA) everywhere, so the model
        every rank evaluates is the one rank 0 saves."""
        if not self.env.distributed:
            return
        store_true_variances(self.model)  # the scale each process keeps need not be rank 0's
        tensors = list(self.model.buffers()) + (self.ema.synced_tensors() if self.ema is not None else [])
        broadcast_tensors(tensors, src=0)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> Dict[str, Any]:
        """Everything needed to continue this run exactly (this process's RNG is added by ``save``)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "ema": self.ema.state_dict() if self.ema else None,
            "position": self.position.state_dict(),
            "hooks": {hook.hook_name: hook.state_dict() for hook in self.hooks},
            "config": self.config,
            **({ckpt.CLASSES_KEY: self.classes} if self.classes else {}),
        }

    def save(
        self,
        name: str,
        extra: Optional[Mapping[str, Any]] = None,
        copies: Sequence[str] = (),
        on_written: Optional[Callable[[], None]] = None,
    ) -> None:
        """Collective: every rank's RNG state is gathered; rank 0 writes ``<name>.pt`` (and each of
        ``copies``) from a host copy in the background (``BackgroundWriter``, one write in flight).
        Once whole, the files are logged, tracked and ``on_written`` runs (next step, next save or
        ``wait_for_checkpoints``), where a failed write is raised."""
        if not self.save_dir:
            raise ConfigError("the trainer has no save_dir: checkpoints cannot be written")
        self.check_finite()
        self.sync_buffers()
        self.check_state_finite(f"{name}{ckpt.SUFFIX} is not written")
        rng_states = all_gather_object(capture_rng_state(), self.env)
        names = [name, *copies]
        paths = [os.path.join(self.save_dir, n + ckpt.SUFFIX) for n in names]
        step = self.position.global_step
        if self.env.is_main:

            def written() -> None:
                for saved_name, path in zip(names, paths):
                    logger.info("saved %s", path)
                    self.writer.log_checkpoint(saved_name, path, step)
                if on_written is not None:
                    on_written()

            state = dict(self.state_dict(), rng=rng_states, **(extra or {}))
            self.checkpoint_writer.submit(state, paths, f"global_step {step}", written)
        self.last_good = (paths[0], step)

    def wait_for_checkpoints(self, raise_error: bool = True) -> None:
        """Wait for the background write in flight (rank 0); its error raised, or logged."""
        self.checkpoint_writer.wait(raise_error)

    def check_finite(self) -> None:
        """Collective: ``NonFiniteError`` (step, loss terms, last good checkpoint) if a step was not
        finite since the start; nothing without ``nan_policy``."""
        if self.nonfinite is not None:
            self.nonfinite.check(self.env, self.last_good)

    def check_state_finite(self, consequence: str) -> None:
        """``NonFiniteError`` (saying ``consequence``) when a weight or buffer of the model or its
        EMA holds a NaN or Inf, e.g. after an overflowing update (one fused check, read once)."""
        found = nonfinite_tensors(model_state(self.model, self.ema.module if self.ema else None))
        if found:
            raise NonFiniteError(
                f"the model is not finite at global_step {self.position.global_step}: {describe(found)}; "
                f"{consequence}; {last_good_text(self.last_good)} with a lower learning rate or with "
                f"Global.grad_clip"
            )

    def load_state_dict(
        self,
        state: Mapping[str, Any],
        source: str = "the checkpoint",
        on_relayout: Optional[Callable[[Mapping[str, Any], Layout], None]] = None,
    ) -> None:
        """Continue the run of ``state`` (from ``state_dict``/``save``): with the same layout
        exactly, RNG streams included; with another number of processes or batch size from the
        same sample of the same epoch. ``on_relayout(saved position, this layout)`` is called
        first in that case and may refuse by raising."""
        saved = check_resumable(state, source, self.model, self.classes, self.position)
        same_layout = saved == self.position.layout
        if not same_layout and on_relayout is not None:
            on_relayout(state["position"], self.position.layout)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        load_scaler_state(self.scaler, state.get("scaler") or {}, source)
        if self.ema is not None and state.get("ema"):
            self.ema.load_state_dict(state["ema"])
        self.position.load_state_dict(state["position"])
        if not same_layout:
            self.position.relayout(self.sampler)
            self.scheduler.load_state_dict({"last_step": self.position.global_step})
        self._pending_hook_states = dict(state.get("hooks") or {})
        for hook in self.hooks:
            if hook.hook_name in self._pending_hook_states:
                hook.load_state_dict(self._pending_hook_states.pop(hook.hook_name))
        rng = state.get("rng") or []
        if same_layout and len(rng) == self.env.world_size:
            restore_rng_state(rng[self.env.rank])
