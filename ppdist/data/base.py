"""Dataset base class: per-sample seeding and bad-sample handling shared by every task."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from torch.utils.data import Dataset, get_worker_info

from ppdist.data.pending_image import materialize
from ppdist.utils.input_size import describe_too_small, too_small
from ppdist.utils.rng import kept_cpu_rng_streams, seed_cpu_rngs

Transform = Callable[[Dict[str, Any]], Optional[Dict[str, Any]]]
BAD_SAMPLES_KEY = "_bad_samples"
NOTES_KEY = "_notes"  # what a transform changed in a sample it kept (e.g. dropped label characters)
SAMPLE_SEED_KEY = "_sample_seed"  # seeds batch transforms (see ppdist.data.build.collate)
SAMPLE_INDEX_KEY = "_sample_index"  # an eval sample's dataset index (metrics name their samples by it)
STEP_SEED_KEY = "_step_seed"  # seeds batch transforms: the same for every sample of an optimizer step
DEVICE_TRANSFORM_KEY = (
    "_device_transform"  # what the loader left to the device (ppdist.data.device_transforms)
)


class RejectedSample(Exception):
    """Raised by a transform that cannot use a sample; its message is the reason shown to the user."""


def add_note(data: Dict[str, Any], note: str) -> None:
    """Record what a transform changed in ``data`` (reported with the sample's origin)."""
    data.setdefault(NOTES_KEY, []).append(note)


def inside_root(root: str, path: str, allowed_outside: bool, switch: str) -> str:
    """``path`` (already joined with ``root``) when it resolves inside ``root`` (links followed), or
    when paths outside are ``allowed_outside``; else ``RejectedSample`` before anything is read."""
    if not allowed_outside:
        real_root, real = os.path.realpath(root), os.path.realpath(path)
        if os.path.commonpath([real_root, real]) != real_root:
            raise RejectedSample(
                f"path {path} resolves outside {root} ({real}); not read. If the list points there on "
                f"purpose, set {switch}: true in the dataset"
            )
    return path


@dataclass
class BadSample:
    """A sample that could not be used: where it came from and why."""

    origin: str
    reason: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.reason}"


def sample_seed(base_seed: int, epoch: int, index: int) -> int:
    """A 32-bit seed that depends on (seed, epoch, sample index) only.

    Seeding the augmentation RNGs per sample makes the data stream independent of the
    number of workers and of where a run was interrupted, so a resumed run sees exactly
    the samples an uninterrupted run would, and every epoch / rank gets fresh randomness.
    """
    return zlib.crc32(np.array([base_seed, epoch, index], dtype=np.int64).tobytes())


def step_seed(base_seed: int, epoch: int, step: int) -> int:
    """A 32-bit seed that depends on (seed, epoch, optimizer step of the epoch) only: the batch
    transforms of every rank and micro-batch of one step draw the same random choices from it
    (one multi-scale size per step for the whole job, so no rank waits for a larger one)."""
    return zlib.crc32(np.array([base_seed, epoch, step, -1], dtype=np.int64).tobytes())


def apply_transforms(ops: Sequence[Transform], data: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Run ``ops`` in order; ``None`` from any op means the sample is unusable."""
    for op in ops:
        data = op(data)
        if data is None:
            return None
    return data


class BaseDataSet(Dataset):
    """A dataset whose items are ``dict``s of numpy arrays after ``transforms``.

    Subclasses implement ``__len__``, ``read(index) -> dict`` (raw sample, e.g.
    ``{"image": bytes, "label": str}``; raise on failure) and ``origin(index) -> str``
    (e.g. ``"train.txt:12 (imgs/a.jpg)"``) for messages, and may override ``finish(data)``
    (the final output layout, applied after the transforms; failures are bad samples too).

    Items are requested as ``(index, epoch, seed)`` tuples by ppdist's samplers (plain ints
    also work); a training item adds the optimizer step of the epoch, whose ``step_seed`` the
    sample carries to the batch transforms. A sample that fails to read or transform is reported, never silently lost:
    - mode ``"train"``: it is replaced by the next usable index (searching the whole data set,
      wrapping around, so a long run of bad lines is bridged) and the failure travels with the
      replacement under ``_bad_samples`` (batch shapes and DDP lockstep are kept); only when no
      sample of the set is usable is a ``BadSample`` returned, and the trainer stops;
    - mode ``"eval"``: a ``BadSample`` is returned; ``collate`` drops it and reports it, so no
      sample is ever counted twice in a metric.
    """

    def __init__(self, transforms: Sequence[Transform], mode: str = "train") -> None:
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        self.ops = list(transforms)
        self.mode = mode
        # samples may leave with their detection geometry pending (``ppdist.data.pending_image``):
        # set by the loader, whose collate draws it (often inside a resize) before stacking
        self.keep_pending_images = False
        # the model's smallest input (height, width; ``ppdist.modeling.input_size``), set by whoever
        # pairs this data with a model: a smaller finished image is a bad sample, not a torch error
        self.min_image_size: Optional[Tuple[int, int]] = None

    def read(self, index: int) -> Dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def origin(self, index: int) -> str:  # pragma: no cover - abstract
        return f"sample {index}"

    def load(self, index: int) -> Union[Dict[str, Any], BadSample]:
        """Read and transform one sample, or describe why it cannot be used."""
        try:
            data = self.read(index)
            self.add_ext_data(data)
            for op in self.ops:
                data = op(data)
                if data is None:
                    return BadSample(
                        self.origin(index),
                        f"rejected by {type(op).__name__} "
                        "(unreadable image, or a label that is empty, too long or has no "
                        "character of the dictionary)",
                    )
            data = self.finish(data)
            if not self.keep_pending_images:
                materialize(data)
            size = self.image_hw(data)
            if size is not None and too_small(size, self.min_image_size):
                reason = describe_too_small(size, self.min_image_size, "after the transforms")
                return BadSample(self.origin(index), reason)
        except RejectedSample as exc:
            return BadSample(self.origin(index), str(exc))
        except Exception as exc:  # any reader/transform failure is a bad sample
            return BadSample(self.origin(index), f"{type(exc).__name__}: {exc}")
        if NOTES_KEY in data:
            data[NOTES_KEY] = [f"{self.origin(index)}: {note}" for note in data[NOTES_KEY]]
        return data

    def add_ext_data(self, data: Dict[str, Any]) -> None:
        """Add to a sample just read what its transforms need from other samples (none here; see
        ``ppdist.data.ext_data``)."""

    def finish(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """The transformed sample in the layout the collate expects (subclasses may override)."""
        return data

    def image_hw(self, data: Mapping[str, Any]) -> Optional[Tuple[int, int]]:
        """(height, width) of a finished sample's image as the model will see it ([C, H, W] here;
        subclasses whose layout differs say so); None when not known before the collate."""
        image = data.get("image")
        if not isinstance(image, np.ndarray) or image.ndim != 3:
            return None
        return int(image.shape[1]), int(image.shape[2])

    #: ``finish`` changes the image from HWC to CHW (and float32) and can leave that to the device
    layout_change_in_finish = False

    def leave_layout_to_device(self) -> Dict[str, str]:
        """From now on ``finish`` keeps the image HWC in the dtype the transforms gave (the loader's
        device transform makes it float32 CHW), and other entries as compact as they are; returns
        the torch dtype each such entry must be cast to on the device. Only for datasets with
        ``layout_change_in_finish``."""
        raise NotImplementedError(f"{type(self).__name__} changes no image layout in finish")

    def __getitem__(self, item: Union[int, Tuple[int, ...]]) -> Union[Dict[str, Any], BadSample]:
        index, epoch, seed, *step = (item, 0, 0) if isinstance(item, (int, np.integer)) else item
        batch_seed = step_seed(seed, epoch, step[0]) if step else None
        if get_worker_info() is None:  # loading in the main process: leave its RNG streams untouched
            with kept_cpu_rng_streams():
                return self.seeded_sample(int(index), epoch, seed, batch_seed)
        return self.seeded_sample(int(index), epoch, seed, batch_seed)

    def seeded_sample(
        self, index: int, epoch: int, seed: int, batch_seed: Optional[int] = None
    ) -> Union[Dict[str, Any], BadSample]:
        """What a loader worker returns for ``(index, epoch, seed[, step])``: the sample with the CPU
        RNGs seeded by ``sample_seed`` (left so: the caller keeps its streams if it needs them), or
        its replacement / ``BadSample`` (see the class doc); ``batch_seed`` (from the step) is
        stored for the batch transforms."""
        rng_seed = sample_seed(seed, epoch, index)
        seed_cpu_rngs(rng_seed)  # the CPU generators only (see ppdist.utils.rng)
        result = self.load(index)
        if isinstance(result, dict):
            result[SAMPLE_SEED_KEY] = rng_seed
            if batch_seed is not None:
                result[STEP_SEED_KEY] = batch_seed
            if self.mode == "eval":
                result[SAMPLE_INDEX_KEY] = index
        if self.mode == "eval" or not isinstance(result, BadSample):
            return result
        for step in range(1, len(self)):
            candidate = self.load((index + step) % len(self))
            if not isinstance(candidate, BadSample):
                candidate[BAD_SAMPLES_KEY] = [str(result)]  # neighbours report themselves
                candidate[SAMPLE_SEED_KEY] = rng_seed
                if batch_seed is not None:
                    candidate[STEP_SEED_KEY] = batch_seed
                return candidate
        return BadSample(self.origin(index), f"{result.reason}; and no sample of the data set is usable")
