"""Build datasets and data loaders from a config section (Train / Eval)."""

from __future__ import annotations

import dataclasses
import random
import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

from ppdist.builder import build_component
from ppdist.data.base import (
    BAD_SAMPLES_KEY,
    DEVICE_TRANSFORM_KEY,
    NOTES_KEY,
    SAMPLE_INDEX_KEY,
    SAMPLE_SEED_KEY,
    STEP_SEED_KEY,
    BadSample,
)
from ppdist.data.device_transforms import DeviceTransform, defer_to_device
from ppdist.data.pending_image import materialize
from ppdist.data.samplers import EvalBatchSampler, TrainBatchSampler, max_accumulate_steps
from ppdist.errors import ConfigError, DataError
from ppdist.registry import DATASETS, TRANSFORMS
from ppdist.utils.memory import keep_freed_memory
from ppdist.utils.rng import kept_cpu_rng_streams, seed_cpu_rngs


def build_transforms(
    ops_cfg: Optional[Sequence[Mapping[str, Any]]], config: Mapping[str, Any], where: str
) -> List[Any]:
    """Build a list of transform ops from ``[{OpName: params}, ...]`` with Global injection."""
    ops = []
    for i, entry in enumerate(ops_cfg or []):
        ((name, params),) = entry.items()
        ops.append(build_component(TRANSFORMS, dict(params or {}, name=name), config, f"{where}[{i}].{name}"))
    return ops


def build_dataset(config: Mapping[str, Any], section: str, mode: str) -> Any:
    """The dataset of ``config[section]`` with its transforms; ``mode`` is 'train' or 'eval'.

    ``batch_transforms`` (PaddleDetection's) are not the dataset's: see ``build_dataloader``.
    """
    cfg = dict(config[section]["dataset"])
    cfg.pop("batch_transforms", None)
    ops = build_transforms(cfg.pop("transforms", None), config, f"{section}.dataset.transforms")
    return build_component(
        DATASETS,
        cfg,
        config,
        f"{section}.dataset",
        transforms=ops,
        mode=mode,
        seed=int(config["Global"]["seed"]),
    )


def apply_batch_transforms(ops: Sequence[Any], samples: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Run batch-level ops on one process's samples: an op with ``batch_op = True`` gets the
    whole list (e.g. one random size per batch), any other op is applied to each sample."""
    for op in ops:
        if getattr(op, "batch_op", False):
            samples = list(op(samples))
        else:
            samples = [op(sample) for sample in samples]
            if any(sample is None for sample in samples):
                raise DataError(f"batch transform {type(op).__name__} rejected a sample")
    return samples


def size_mismatch_message(samples: List[Dict[str, Any]]) -> str:
    """Why ``samples`` do not stack: the first entry whose shapes differ, and what joins them."""
    for key in samples[0]:
        shapes = sorted({tuple(np.shape(s.get(key))) for s in samples})
        if len(shapes) > 1:
            break
    else:
        key, shapes = "image", []
    if key == "image":
        fix = (
            "use batch_size_per_card: 1 for images of varying size (e.g. segmentation eval at full "
            "resolution), add a resize/crop transform, or PadBatch (detection)"
        )
    elif key.startswith("gt_") or key in ("is_crowd", "difficult"):
        fix = "add PadGT to batch_transforms (pads the boxes to the batch's largest count) or use batch_size_per_card: 1"
    else:
        fix = "use batch_size_per_card: 1"
    return f"samples of one batch have different sizes of '{key}' ({shapes[:4]}): {fix}"


def batch_seed(samples: List[Dict[str, Any]]) -> int:
    """The seed of a batch's batch transforms, taken out of its samples: their optimizer step's
    seed (training: the same on every rank and micro-batch of the step, so all draw one size),
    else one made of the samples' own seeds (evaluation, other samplers)."""
    steps = {sample.pop(STEP_SEED_KEY) for sample in samples if STEP_SEED_KEY in sample}
    seeds = [int(sample.pop(SAMPLE_SEED_KEY, 0)) for sample in samples]
    if len(steps) == 1:
        return int(steps.pop())
    return zlib.crc32(np.asarray(seeds, dtype=np.int64).tobytes())


def _seeded(run: Any, seed: int) -> Any:
    """Run ``run()`` with random/numpy/torch seeded from ``seed`` (so a batch's random choices
    do not depend on workers or resumes), restoring the RNG states after."""
    with kept_cpu_rng_streams():
        seed_cpu_rngs(seed)
        return run()


def collate(
    samples: List[Any],
    batch_ops: Sequence[Any] = (),
    device_transform: Optional[DeviceTransform] = None,
) -> Dict[str, Any]:
    """Stack dict samples into a batch; drop and report ``BadSample`` entries.

    ``batch_ops`` run on the good samples first. The returned batch always has
    ``_bad_samples``: descriptions of the samples that were skipped or replaced in it (see
    ``BaseDataSet``), and ``_notes`` when a transform changed a sample it kept; an eval batch
    also has ``_sample_index``, its samples' dataset indices (int64, in batch order); a batch of
    a loader that leaves work to the device has ``_device_transform`` (``move_to_device`` applies it).
    """
    bad: List[str] = []
    notes: List[str] = []
    good: List[Dict[str, Any]] = []
    for sample in samples:
        if isinstance(sample, BadSample):
            bad.append(str(sample))
            continue
        bad.extend(sample.pop(BAD_SAMPLES_KEY, []))
        notes.extend(sample.pop(NOTES_KEY, []))
        good.append(sample)
    seed = batch_seed(good)
    indices = [sample.pop(SAMPLE_INDEX_KEY) for sample in good if SAMPLE_INDEX_KEY in sample]
    if good and batch_ops:
        good = _seeded(lambda: apply_batch_transforms(batch_ops, good), seed)
    good = [materialize(sample) for sample in good]  # geometry still pending (no resize drew it)
    try:
        batch: Dict[str, Any] = default_collate(good) if good else {}
    except RuntimeError as exc:
        if "stack expects each tensor to be equal size" not in str(exc):
            raise
        raise DataError(size_mismatch_message(good)) from None
    if good and len(indices) == len(good):  # eval samples: their dataset indices, kept on the host
        batch[SAMPLE_INDEX_KEY] = torch.tensor(indices, dtype=torch.int64)
    if good and device_transform is not None:
        batch[DEVICE_TRANSFORM_KEY] = device_transform
    batch[BAD_SAMPLES_KEY] = bad
    if notes:
        batch[NOTES_KEY] = notes
    return batch


class Collate:
    """``collate`` with the section's batch transforms and the work it leaves to the device
    (picklable for worker processes)."""

    def __init__(
        self, batch_ops: Sequence[Any] = (), device_transform: Optional[DeviceTransform] = None
    ) -> None:
        self.batch_ops = list(batch_ops)
        self.device_transform = device_transform

    def __call__(self, samples: List[Any]) -> Dict[str, Any]:
        return collate(samples, self.batch_ops, self.device_transform)


def build_input_pipeline(config: Mapping[str, Any], section: str, mode: str) -> Tuple[Any, Collate]:
    """The dataset of ``config[section]`` and the collate (with the batch transforms) that
    ``build_dataloader`` puts together: what one process does to turn sample indices into a batch.

    With ``loader.normalize_on_device`` (the default) the pipeline's trailing normalisation and
    layout change are taken off the CPU: images stay uint8 through the loader and
    ``ppdist.engine.batch.move_to_device`` applies them (bitwise the same; see
    ``ppdist.data.device_transforms``).
    """
    dataset = build_dataset(config, section, mode)
    batch_ops = build_transforms(
        config[section]["dataset"].get("batch_transforms"), config, f"{section}.dataset.batch_transforms"
    )
    dataset.keep_pending_images = True  # the collate draws them
    transform = None
    if config[section]["loader"].get("normalize_on_device", True):
        in_finish = bool(dataset.layout_change_in_finish)
        dataset.ops, batch_ops, transform = defer_to_device(dataset.ops, batch_ops, in_finish)
        if transform is not None and in_finish:
            casts = dataset.leave_layout_to_device()
            transform = dataclasses.replace(transform, casts=tuple(sorted(casts.items())))
    return dataset, Collate(batch_ops, transform)


def batch_input_sizes(batch_ops: Sequence[Any]) -> List[Tuple[int, int]]:
    """The (h, w) input sizes batch transforms draw from (``training_sizes()`` of a multi-scale
    transform such as PP-YOLOE's ``BatchRandomResize``, in its order); empty when none fixes the size."""
    sizes: List[Tuple[int, int]] = []
    for op in batch_ops:
        if hasattr(op, "training_sizes"):
            sizes += [tuple(size) for size in op.training_sizes() if tuple(size) not in sizes]
    return sizes


def loader_input_sizes(loader: Any) -> List[Tuple[int, int]]:
    """``batch_input_sizes`` of ``loader``'s collate (empty for a loader without batch transforms)."""
    return batch_input_sizes(getattr(getattr(loader, "collate_fn", None), "batch_ops", ()))


def train_input_sizes(config: Mapping[str, Any]) -> List[Tuple[int, int]]:
    """``batch_input_sizes`` of ``config``'s Train batch transforms (built, no data read)."""
    ops_cfg = (config.get("Train") or {}).get("dataset", {}).get("batch_transforms")
    return batch_input_sizes(build_transforms(ops_cfg, config, "Train.dataset.batch_transforms"))


def input_size_count(loader: Any) -> int:
    """How many input sizes ``loader``'s batches come in: those of its multi-scale batch
    transform (``loader_input_sizes``), else 1."""
    return max(len(loader_input_sizes(loader)), 1)


class WorkerInit:
    """Seeds ``random``/``numpy``/``torch`` in each worker differently per rank and worker, and
    limits each worker to one torch thread and ``cv2_num_threads`` OpenCV threads (0: OpenCV
    runs single-threaded, the default; -1: OpenCV's own default), so workers do not oversubscribe the cores
    the training process computes on; glibc keeps the worker's freed memory for its next images
    (``ppdist.utils.memory.keep_freed_memory``).

    Samples are additionally re-seeded per (seed, epoch, index) by the dataset, which is
    what makes augmentation independent of the worker count and exact across resumes.
    """

    def __init__(self, seed: int, rank: int, cv2_num_threads: int = 0) -> None:
        self.seed = seed
        self.rank = rank
        self.cv2_num_threads = cv2_num_threads

    def __call__(self, worker_id: int) -> None:
        cv2.setNumThreads(int(self.cv2_num_threads))
        torch.set_num_threads(1)
        keep_freed_memory()
        # torch gives every worker a fresh base seed each time the workers (re)start
        worker_seed = (torch.initial_seed() + 1000003 * self.rank + worker_id) % 2**32
        random.seed(worker_seed)
        np.random.seed(worker_seed)


def loader_options(loader_cfg: Mapping[str, Any], device_type: str) -> Dict[str, Any]:
    """pin_memory / persistent_workers / prefetch_factor as the DataLoader gets them: pinned
    memory with CUDA and persistent workers unless the config says otherwise."""
    pin, persistent = loader_cfg.get("pin_memory"), loader_cfg.get("persistent_workers")
    options: Dict[str, Any] = {"pin_memory": (device_type == "cuda") if pin is None else bool(pin)}
    if int(loader_cfg["num_workers"]) > 0:
        options["persistent_workers"] = True if persistent is None else bool(persistent)
        if loader_cfg.get("prefetch_factor") is not None:
            options["prefetch_factor"] = int(loader_cfg["prefetch_factor"])
    return options


def check_accumulation(
    section: str, dataset_len: int, batch_size: int, world_size: int, drop_last: bool, accumulate: int
) -> None:
    """ConfigError naming the largest ``Global.accumulate_steps`` that works when an optimizer step
    of ``accumulate`` micro-batches would be longer than an epoch."""
    largest = max_accumulate_steps(dataset_len, batch_size, world_size, drop_last)
    if accumulate <= max(largest, 1):
        return  # (largest 0: not even one full batch; the batch size is the mistake, said below)
    raise ConfigError(
        f"Global.accumulate_steps {accumulate} is larger than an epoch: {section} gives {largest} "
        f"batch(es) of {batch_size} per process ({dataset_len} samples over {world_size} process(es)"
        f"{', drop_last' if drop_last else ''}); the largest Global.accumulate_steps that works for this "
        f"data set is {largest}"
    )


def build_dataloader(
    config: Mapping[str, Any],
    section: str,
    mode: str,
    rank: int = 0,
    world_size: int = 1,
    device_type: str = "cpu",
) -> DataLoader:
    """A DataLoader over ``config[section]`` with ppdist's samplers and collate."""
    dataset, collate_fn = build_input_pipeline(config, section, mode)
    loader_cfg = config[section]["loader"]
    seed = int(config["Global"]["seed"])
    batch_size = int(loader_cfg["batch_size_per_card"])
    if mode == "train" and len(dataset) == 0:
        sources = getattr(dataset, "label_files", None) or [
            str(getattr(dataset, name))
            for name in ("anno_path", "train_path", "dataset_root")
            if hasattr(dataset, name)
        ]
        raise DataError(
            f"{section}.dataset has no sample{(' (' + ', '.join(map(str, sources)) + ')') if sources else ''}: "
            f"check its label file / annotation file / dataset_root"
        )
    if mode == "train":
        accumulate = int(config["Global"].get("accumulate_steps") or 1)
        check_accumulation(
            section, len(dataset), batch_size, world_size, bool(loader_cfg["drop_last"]), accumulate
        )
        sampler: Any = TrainBatchSampler(
            len(dataset),
            batch_size,
            rank,
            world_size,
            shuffle=bool(loader_cfg["shuffle"]),
            drop_last=bool(loader_cfg["drop_last"]),
            seed=seed,
            accumulate_steps=accumulate,
        )
        if len(sampler) == 0:
            processes = (
                f"{world_size} process(es) x Global.accumulate_steps {sampler.accumulate_steps}"
                if sampler.accumulate_steps > 1
                else f"{world_size} process(es)"
            )
            raise DataError(
                f"{section}: {len(dataset)} samples over {processes} give no full "
                f"batch of {batch_size}; lower {section}.loader.batch_size_per_card or set drop_last: false"
            )
    else:
        sampler = EvalBatchSampler(len(dataset), batch_size, rank, world_size, seed=seed)
    workers = int(loader_cfg["num_workers"])
    generator = torch.Generator()
    generator.manual_seed(seed + rank)  # keep the global RNG untouched by loader start-up
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=collate_fn,
        worker_init_fn=WorkerInit(seed, rank, loader_cfg.get("cv2_num_threads", 0)),
        generator=generator,
        **loader_options(loader_cfg, device_type),
    )


def set_min_image_size(loader: Any, size: Optional[Tuple[int, int]]) -> None:
    """Make ``loader``'s finished images smaller than ``size`` (a model's smallest input, height and
    width) bad samples named with their file and line; call it before the loader's workers start."""
    loader.dataset.min_image_size = None if size is None else (int(size[0]), int(size[1]))
