"""Test helpers: one training step of any config on a synthetic batch, without its data set.

``step_trainer(config, batch_size, size)`` builds a config's model, loss, optimizer, AMP, EMA and
gradient clipping as ``build_trainer`` does, with an in-memory loader of synthetic samples of the
config's task; ``trainer.step(device_batch(trainer, batch))`` is then one full training step.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch.utils.data import DataLoader

from ppdist.components import build_loss, build_model
from ppdist.data.samplers import TrainBatchSampler
from ppdist.engine.amp import make_autocast
from ppdist.engine.batch import move_to_device
from ppdist.engine.device_settings import apply_backend_settings, channels_last
from ppdist.engine.dist import DistEnv
from ppdist.engine.setup import build_ema, build_optimizer, build_weight_update, place_model
from ppdist.engine.trainer import EPOCH_KEY, Trainer


def synthetic_sample(config: Mapping[str, Any], size: Tuple[int, int], index: int) -> Dict[str, torch.Tensor]:
    """One sample of the config's task (rec: text image + label; det: boxes; seg: label map)."""
    generator = torch.Generator().manual_seed(index)
    height, width = size
    kind = config["Architecture"]["model_type"]
    image = torch.randn(3, height, width, generator=generator)
    if kind == "rec":
        classes = 11  # labels 1..10 exist in every dictionary (0 is the CTC blank)
        max_len = config["Global"]["max_text_length"]
        length = 3 + index % 4
        label = torch.zeros(max_len, dtype=torch.long)
        label[:length] = torch.randint(1, classes, (length,), generator=generator)
        # PP-OCRv3's multi-head labels: the CTC label, and SAR targets valid in every class count
        label_sar = torch.randint(1, classes, (max_len,), generator=generator)
        return {
            "image": image,
            "label": label,
            "length": torch.tensor(length),
            "label_ctc": label,
            "label_sar": label_sar,
            "valid_ratio": torch.tensor(1.0),
        }
    if kind == "det":
        classes = config["Global"].get("num_classes") or config["Architecture"]["Head"]["num_classes"]
        boxes, count = 6, 2 + index % 4  # padded to 6 ground truths, 2..5 real
        xy = torch.rand(boxes, 2, generator=generator) * torch.tensor([width * 0.6, height * 0.6])
        wh = (0.1 + 0.3 * torch.rand(boxes, 2, generator=generator)) * torch.tensor([width, height])
        real = (torch.arange(boxes) < count).float().unsqueeze(-1)
        return {
            "image": image,
            "gt_bbox": torch.cat([xy, xy + wh], dim=-1) * real,
            "gt_class": torch.randint(0, classes, (boxes, 1), generator=generator) * real.long(),
            "pad_gt_mask": real,
        }
    if kind == "seg":
        classes = config["Global"]["num_classes"]
        label = torch.randint(0, classes, (height, width), generator=generator)
        label[: height // 8] = 255  # an ignored band
        return {"image": image, "label": label}
    if kind == "table":  # SLANet's batch: sos, tokens valid in every structure dictionary, eos, padding
        steps, length = config["Global"]["max_text_length"] + 2, 4 + index % 5
        structure = torch.zeros(steps, dtype=torch.long)
        structure[1 : length + 1] = torch.randint(1, 28, (length,), generator=generator)
        structure[length + 1] = 29
        masks = torch.zeros(steps)
        masks[1 : length + 1] = (torch.rand(length, generator=generator) < 0.6).float()
        reg = config["Architecture"]["Head"].get("loc_reg_num", 4)
        return {
            "image": image,
            "structure": structure,
            "bboxes": torch.rand(steps, reg, generator=generator) * masks.unsqueeze(-1),
            "bbox_masks": masks,
            "length": torch.tensor(length),
            "shape": torch.tensor([height, width, 1.0, 1.0, height, width]),
        }
    raise ValueError(f"no synthetic samples for model_type {kind!r}")


class _Samples(torch.utils.data.Dataset):
    def __init__(self, samples: List[Dict[str, torch.Tensor]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: Tuple[int, ...]) -> Dict[str, torch.Tensor]:
        return dict(self.samples[item[0]])  # TrainBatchSampler's items: (index, epoch, ...)


def step_trainer(
    config: Mapping[str, Any],
    batch_size: int,
    size: Tuple[int, int],
    env: Optional[DistEnv] = None,
    steps: int = 8,
    nan_policy: Optional[str] = None,
) -> Trainer:
    """A trainer of ``config``'s parts over ``steps`` synthetic batches of ``batch_size`` at ``size``."""
    glob = config["Global"]
    env = env or DistEnv()
    if env.device.type == "cuda":  # as the trainer's setup: cuDNN, TF32, determinism
        apply_backend_settings(glob, env.device)
    torch.manual_seed(glob["seed"])
    model = place_model(build_model(config), glob, env)
    loss_fn = build_loss(config)
    loss_fn.to(env.device)
    samples = [synthetic_sample(config, size, i) for i in range(batch_size * steps)]
    loader = DataLoader(_Samples(samples), batch_sampler=TrainBatchSampler(len(samples), batch_size, seed=0))
    optimizer, scheduler = build_optimizer(config, model, len(loader))
    autocast, use_scaler = make_autocast(glob, env.device)
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
    )


def device_batch(trainer: Trainer, batch: Dict[str, Any], epoch: int = 1) -> Dict[str, Any]:
    """``batch`` as the trainer's ``run_step`` hands it to ``step``."""
    batch = move_to_device(batch, trainer.env.device, trainer.channels_last, keep_on_host=trainer.host_keys)
    batch[EPOCH_KEY] = epoch - 1
    return batch
