"""Visit every training input size once before the first step, leaving no trace in the run.

A multi-scale recipe (PP-YOLOE's ``BatchRandomResize``: 15 sizes) with cuDNN autotuning on pays
a search per convolution shape the first time training draws each size, in the middle of
training, on every rank and after every restart. ``warm_input_sizes`` runs one forward and
backward of the model at each size on synthetic batches (``Task.training_sample``) before
training, so the searches (and the allocator's and the heads' per-shape caches) happen there,
once. It is a pure side trip: the gradients go to ``torch.autograd.grad`` (not ``.grad``), the
parameters and buffers (BatchNorm statistics) are put back bit for bit, the RNG streams
restored, and the optimizer, LR schedule, EMA and run position are never touched.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

import torch
from torch import nn
from torch.utils.data._utils.collate import default_collate

from ppdist.engine.step_batches import EPOCH_KEY
from ppdist.engine.trainer import Trainer
from ppdist.modeling.batch_norm import restore_variance_scales, variance_scales
from ppdist.tasks import get_task
from ppdist.utils.rng import capture_rng_state, restore_rng_state

Size = Tuple[int, int]


def synthetic_batch(config: Mapping[str, Any], size: Size, batch_size: int) -> Dict[str, Any]:
    """A host batch of ``batch_size`` synthetic training samples of ``config``'s task at ``size``."""
    task = get_task(config)
    if task.training_sample is None:
        raise ValueError(f"task {task.name!r} has no synthetic training samples to warm its sizes with")
    return default_collate([task.training_sample(config, size, i) for i in range(batch_size)])


def warm_input_sizes(
    model: nn.Module,
    loss_fn: Callable[..., Mapping[str, Any]],
    sizes: Sequence[Size],
    make_batch: Callable[[Size], Dict[str, Any]],
    autocast: Callable[[], Any] = contextlib.nullcontext,
) -> List[Size]:
    """One forward (under ``autocast``) and backward of ``model`` with ``loss_fn`` on the device
    batch ``make_batch(size)`` for each of ``sizes`` in order, with no effect on the run; returns
    the sizes visited."""
    tensors = list(itertools.chain(model.parameters(), model.buffers()))
    saved = [t.detach().clone() for t in tensors]  # BatchNorm variances as stored, with their scales:
    scales = variance_scales(model)  # a new size rescales them (ppdist.modeling.batch_norm)
    params = [p for p in model.parameters() if p.requires_grad]
    rng = capture_rng_state()
    was_training = model.training
    visited: List[Size] = []
    model.train()
    try:
        for size in sizes:
            batch = make_batch(size)
            with autocast():
                preds = model(batch)
            loss = loss_fn(preds, batch)["loss"]
            torch.autograd.grad(loss, params, allow_unused=True)
            visited.append(tuple(size))
    finally:
        with torch.no_grad():
            for tensor, value in zip(tensors, saved):
                tensor.copy_(value)
        restore_variance_scales(scales)
        restore_rng_state(rng)
        model.train(was_training)
    return visited


def warm_training_sizes(trainer: Trainer, config: Mapping[str, Any], sizes: Sequence[Size]) -> Dict[str, Any]:
    """``warm_input_sizes`` over ``sizes`` with synthetic batches of the trainer's per-process
    batch size; returns ``{sizes, seconds}``."""
    batch_size = trainer.position.layout.batch_size
    start = time.perf_counter()
    if trainer.env.device.type == "cuda":
        torch.cuda.synchronize(trainer.env.device)
    epoch = trainer.position.next_epoch - 1

    def make_batch(size: Size) -> Dict[str, Any]:
        batch = trainer.to_device(synthetic_batch(config, size, batch_size))
        batch[EPOCH_KEY] = epoch
        return batch

    visited = warm_input_sizes(trainer.model, trainer.loss_fn, sizes, make_batch, trainer.autocast)
    if trainer.env.device.type == "cuda":
        torch.cuda.synchronize(trainer.env.device)
    return {"sizes": visited, "seconds": time.perf_counter() - start}
