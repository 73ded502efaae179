"""Batch samplers: resumable sharded training order and exact contiguous eval shards.

Both yield lists of ``(index, epoch, seed)`` items; the dataset seeds its augmentation
RNGs from that triple (see ``ppdist.data.base.sample_seed``).
"""

from __future__ import annotations

from typing import Iterator, List, Tuple

import torch
from torch.utils.data import Sampler

Item = Tuple[int, int, int]


class TrainBatchSampler(Sampler[List[Item]]):
    """Seeded permutation shared by all ranks, padded to divide evenly, sharded by rank.

    Every rank draws the same permutation of the data set from ``(seed, epoch)``. The samples
    not yet trained in this epoch (all of them, or those after ``consumed`` when a run resumes)
    are padded by cycling the permutation from its start so that every rank gets the same
    number (DDP lockstep), and rank ``r`` takes positions ``r, r + world, ...``. After ``k``
    steps the ranks together have used exactly the first ``k * batch_size * world_size``
    samples of the permutation, so a position is a single number that any world size can
    continue from: no sample of the epoch is repeated or skipped.
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
    ) -> None:
        if dataset_len <= 0:
            raise ValueError("the training dataset is empty")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.epoch = 0
        self.consumed = 0

    @property
    def samples_per_step(self) -> int:
        """Samples of the permutation used by one step of all ranks together."""
        return self.batch_size * self.world_size

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
        per_rank = -(-remaining // self.world_size)
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def rank_indices(self) -> List[int]:
        """This rank's sample indices for the rest of the epoch, in order."""
        order = self.epoch_order()
        rest = order[self.consumed :]
        total = -(-len(rest) // self.world_size) * self.world_size
        while len(rest) < total:
            rest += order[: total - len(rest)]
        return rest[self.rank : total : self.world_size]

    def __len__(self) -> int:
        """Batches in a whole epoch (independent of the position)."""
        return self._batches(self.dataset_len)

    def remaining_batches(self) -> int:
        """Batches the next iteration yields (the rest of the epoch from the position)."""
        return self._batches(max(0, self.dataset_len - self.consumed))

    def __iter__(self) -> Iterator[List[Item]]:
        indices = self.rank_indices()
        for b in range(self.remaining_batches()):
            chunk = indices[b * self.batch_size : (b + 1) * self.batch_size]
            yield [(i, self.epoch, self.seed) for i in chunk]
        self.consumed = 0  # only the resumed epoch starts in the middle


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
