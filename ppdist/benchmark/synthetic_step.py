"""One training step of any config on synthetic batches, without its data set.

``step_trainer(config, batch_size, size)`` builds a config's model, loss, optimizer, AMP, EMA and
gradient clipping as ``build_trainer`` does, over an in-memory loader of the task's synthetic
samples (``Task.training_sample``); ``trainer.step(device_batch(trainer, batch))`` is then one full
training step. Used by the op counter (``tools/benchmark.py --count_ops``) and the step tests.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch.utils.data import DataLoader, Dataset

from ppdist.components import build_loss, build_model
from ppdist.data.samplers import TrainBatchSampler
from ppdist.engine.amp import make_autocast
from ppdist.engine.batch import move_to_device
from ppdist.engine.device_settings import apply_backend_settings, channels_last
from ppdist.engine.dist import DistEnv
from ppdist.engine.setup import build_ema, build_optimizer, build_weight_update, place_model
from ppdist.engine.step_batches import EPOCH_KEY
from ppdist.engine.trainer import Trainer
from ppdist.tasks import get_task


def synthetic_sample(config: Mapping[str, Any], size: Tuple[int, int], index: int) -> Dict[str, torch.Tensor]:
    """One synthetic training sample of ``config``'s task at ``size`` (height, width), seeded by ``index``."""
    task = get_task(config)
    if task.training_sample is None:
        raise ValueError(f"task {task.name!r} has no synthetic training samples")
    return task.training_sample(config, size, index)


class SyntheticSamples(Dataset):
    """Samples held in memory, indexed as ``TrainBatchSampler`` indexes: ``(index, epoch, ...)``."""

    def __init__(self, samples: List[Dict[str, torch.Tensor]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: Tuple[int, ...]) -> Dict[str, torch.Tensor]:
        return dict(self.samples[item[0]])


def step_trainer(
    config: Mapping[str, Any],
    batch_size: int,
    size: Tuple[int, int],
    env: Optional[DistEnv] = None,
    steps: int = 8,
    nan_policy: Optional[str] = None,
    capture_step: bool = False,
) -> Trainer:
    """A trainer of ``config``'s parts over ``steps`` synthetic batches of ``batch_size`` at ``size``
    (``capture_step``: the captured step of ``Global.cuda_graph``)."""
    glob = config["Global"]
    env = env or DistEnv()
    if env.device.type == "cuda":  # as the trainer's setup: cuDNN, TF32, determinism
        apply_backend_settings(glob, env.device)
    torch.manual_seed(glob["seed"])
    model = place_model(build_model(config), glob, env)
    loss_fn = build_loss(config)
    loss_fn.to(env.device)
    samples = [synthetic_sample(config, size, i) for i in range(batch_size * steps)]
    loader = DataLoader(
        SyntheticSamples(samples), batch_sampler=TrainBatchSampler(len(samples), batch_size, seed=0)
    )
    optimizer, scheduler = build_optimizer(config, model, len(loader))
    autocast, use_scaler = make_autocast(
        dict(glob, cuda_graph=capture_step or glob.get("cuda_graph")), env.device
    )
    return Trainer(
        model,
        loss_fn,
        optimizer,
        scheduler,
        loader,
        total_steps=steps,
        env=env,
        autocast=autocast,
        update=build_weight_update(
            config,
            model,
            optimizer,
            scheduler,
            env,
            use_scaler,
            ema=build_ema(model, glob),
            nan_policy=nan_policy,
        ),
        channels_last=channels_last(glob, env.device),
        capture_step=capture_step,
    )


def device_batch(trainer: Trainer, batch: Dict[str, Any], epoch: int = 1) -> Dict[str, Any]:
    """``batch`` as the trainer's ``run_step`` hands it to ``step``."""
    batch = move_to_device(batch, trainer.env.device, trainer.channels_last, keep_on_host=trainer.host_keys)
    batch[EPOCH_KEY] = epoch - 1
    return batch
