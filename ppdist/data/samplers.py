"""Batch samplers: resumable sharded training order and exact contiguous eval shards.

Both yield lists of ``(index, epoch, seed)`` items; the dataset seeds its augmentation
RNGs from that triple (see ``ppdist.data.base.sample_seed``). Training items carry a fourth
number, the optimizer step of the epoch the sample is trained at: the batch transforms' random
choices (the multi-scale size) are drawn from ``(seed, epoch, step)``, the same on every rank and
every micro-batch of the step (``ppdist.data.base.step_seed``).
"""

from __future__ import annotations

from typing import Iterator, List, Tuple

import numpy as np
import torch
from torch.utils.data import Sampler

Item = Tuple[int, ...]  # (index, epoch, seed) or, for training, (index, epoch, seed, step)


class TrainBatchSampler(Sampler[List[Item]]):
    """Seeded permutation shared by all ranks, padded to divide evenly, sharded by rank.

    Every rank draws the same permutation of the data set from ``(seed, epoch)``. The samples
    not yet trained in this epoch (all of them, or those after ``consumed`` when a run resumes)
    are padded by cycling the permutation from its start so that every rank gets the same
    number (DDP lockstep), and rank ``r`` takes positions ``r, r + world, ...``. After ``k``
    steps the ranks together have used exactly the first ``k * samples_per_step`` samples of
    the permutation, so a position is a single number that any world size can continue from:
    no sample of the epoch is repeated or skipped.

    With ``accumulate_steps = K`` one optimizer step is made of ``K`` micro-batches per rank,
    and the sampler yields them in order: micro-batch ``m`` of rank ``r`` is the batch that rank
    ``r * K + m`` of ``world_size * K`` processes would get at that step (the same samples, hence
    the same augmentation seeds), so ``N`` processes accumulating ``K`` steps train on exactly
    the batches of ``N * K`` processes. ``len()`` counts micro-batches (what the loader yields);
    ``steps_per_epoch`` and ``remaining_batches()`` count optimizer steps.
    """

    def __init__(
        self,
        dataset_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        accumulate_steps: int = 1,
    ) -> None:
        if dataset_len <= 0:
            raise ValueError("the training dataset is empty")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if accumulate_steps < 1:
            raise ValueError(f"accumulate_steps must be >= 1, got {accumulate_steps}")
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.accumulate_steps = accumulate_steps
        self.epoch = 0
        self.consumed = 0

    @property
    def virtual_world_size(self) -> int:
        """The processes one accumulated step stands for: ``world_size * accumulate_steps``."""
        return self.world_size * self.accumulate_steps

    @property
    def samples_per_step(self) -> int:
        """Samples of the permutation used by one optimizer step of all ranks together."""
        return self.batch_size * self.virtual_world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_position(self, consumed: int) -> None:
        """Skip the first ``consumed`` samples of this epoch's permutation (all ranks together)."""
        self.consumed = max(0, int(consumed))

    def epoch_order(self) -> List[int]:
        """The epoch's permutation of all sample indices (identical on every rank)."""
        if not self.shuffle:
            return list(range(self.dataset_len))
        gen = torch.Generator()
        gen.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_len, generator=gen).tolist()

    def _batches(self, remaining: int) -> int:
        per_rank = -(-remaining // self.virtual_world_size)
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def _padded(self, order: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The samples at ``positions`` of the rest of the epoch padded by cycling the permutation:
        ``rest + order + order + ...`` (``rest``: the permutation after ``consumed``)."""
        rest = len(order) - self.consumed
        inside = np.minimum(positions, max(rest - 1, 0)) + self.consumed
        return np.where(positions < rest, order[inside], order[(positions - rest) % len(order)])

    def _shard_length(self) -> int:
        """Samples each virtual rank gets for the rest of the epoch (padding included)."""
        return -(-max(0, self.dataset_len - self.consumed) // self.virtual_world_size)

    def virtual_rank_indices(self) -> List[List[int]]:
        """For each of this rank's ``accumulate_steps`` virtual ranks, its sample indices for
        the rest of the epoch, in order (for tests: ``__iter__`` computes one micro-batch at a time)."""
        order = np.asarray(self.epoch_order(), dtype=np.int64)
        world, length = self.virtual_world_size, self._shard_length()
        first = self.rank * self.accumulate_steps
        return [
            self._padded(order, v + world * np.arange(length)).tolist()
            for v in range(first, first + self.accumulate_steps)
        ]

    def rank_indices(self) -> List[int]:
        """This rank's sample indices for the rest of the epoch, in the order they are yielded."""
        return [index for batch in self._micro_batches() for index in batch]

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in a whole epoch (independent of the position)."""
        return self._batches(self.dataset_len)

    def __len__(self) -> int:
        """Micro-batches in a whole epoch: ``steps_per_epoch * accumulate_steps``."""
        return self.steps_per_epoch * self.accumulate_steps

    def remaining_batches(self) -> int:
        """Optimizer steps the next iteration yields (the rest of the epoch from the position)."""
        return self._batches(max(0, self.dataset_len - self.consumed))

    def _micro_batches(self) -> Iterator[List[int]]:
        """Micro-batch ``m`` of step ``k``: batch ``k`` of virtual rank ``rank * K + m``, computed
        when it is yielded (memory in the data set's size, whatever ``accumulate_steps``)."""
        order = np.asarray(self.epoch_order(), dtype=np.int64)
        world, length, size = self.virtual_world_size, self._shard_length(), self.batch_size
        first = self.rank * self.accumulate_steps
        for step in range(self.remaining_batches()):
            columns = np.arange(step * size, min((step + 1) * size, length))
            for v in range(first, first + self.accumulate_steps):
                yield self._padded(order, v + world * columns).tolist()

    def first_step(self) -> int:
        """The optimizer step of the epoch (0-based) that the next iteration starts with."""
        return self.consumed // self.samples_per_step

    def __iter__(self) -> Iterator[List[Item]]:
        first = self.first_step()
        for position, batch in enumerate(self._micro_batches()):
            step = first + position // self.accumulate_steps
            yield [(i, self.epoch, self.seed, step) for i in batch]
        self.consumed = 0  # only the resumed epoch starts in the middle


def max_accumulate_steps(dataset_len: int, batch_size: int, world_size: int, drop_last: bool) -> int:
    """The largest ``accumulate_steps`` whose optimizer step fits in an epoch: the batches each
    process gets in an epoch without accumulation (0: not even one full batch with ``drop_last``)."""
    return TrainBatchSampler(dataset_len, batch_size, 0, world_size, drop_last=drop_last).steps_per_epoch


def eval_shard(dataset_len: int, rank: int, world_size: int, batch_size: int = 1) -> range:
    """Contiguous, unpadded shard of ``rank``, made of whole batches of the single-process order.

    The ``ceil(len / batch_size)`` batches are split into contiguous runs whose counts differ
    by at most one, so every sample is evaluated in exactly the batch it would be in with one
    process (same shapes, same kernels: bitwise-equal outputs) and the union is exact.
    """
    batches = -(-dataset_len // batch_size)
    base, extra = divmod(batches, world_size)
    first = rank * base + min(rank, extra)
    last = first + base + (1 if rank < extra else 0)
    return range(min(first * batch_size, dataset_len), min(last * batch_size, dataset_len))


class EvalBatchSampler(Sampler[List[Item]]):
    """Batches over this rank's contiguous shard (whole single-process batches); no sample is
    repeated or missed."""

    def __init__(
        self, dataset_len: int, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0
    ) -> None:
        self.shard = eval_shard(dataset_len, rank, world_size, batch_size)
        self.batch_size = batch_size
        self.seed = seed

    def __len__(self) -> int:
        return -(-len(self.shard) // self.batch_size)

    def __iter__(self) -> Iterator[List[Item]]:
        for start in range(0, len(self.shard), self.batch_size):
            yield [(i, 0, self.seed) for i in self.shard[start : start + self.batch_size]]
