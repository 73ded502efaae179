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

    Every rank draws the same permutation from ``(seed, epoch)``, pads it by repeating its
    head so that all ranks get the same number of samples (DDP lockstep), and takes the
    indices ``rank, rank + world, ...``. ``set_epoch(e)`` selects the epoch and
    ``set_start_batch(k)`` skips the first ``k`` batches of that epoch, so a resumed run
    continues with the next unseen batch.
    """

    def __init__(self, dataset_len: int, batch_size: int, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, drop_last: bool = False, seed: int = 0) -> None:
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
        self.start_batch = 0
        self.samples_per_rank = -(-dataset_len // world_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_start_batch(self, start_batch: int) -> None:
        self.start_batch = max(0, int(start_batch))

    def rank_indices(self) -> List[int]:
        """This rank's sample indices for the current epoch, in order."""
        if self.shuffle:
            gen = torch.Generator()
            gen.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_len, generator=gen).tolist()
        else:
            order = list(range(self.dataset_len))
        total = self.samples_per_rank * self.world_size
        while len(order) < total:
            order += order[: total - len(order)]
        return order[self.rank:total:self.world_size]

    def __len__(self) -> int:
        """Batches per epoch (independent of ``start_batch``)."""
        if self.drop_last:
            return self.samples_per_rank // self.batch_size
        return -(-self.samples_per_rank // self.batch_size)

    def __iter__(self) -> Iterator[List[Item]]:
        indices = self.rank_indices()
        for b in range(self.start_batch, len(self)):
            chunk = indices[b * self.batch_size:(b + 1) * self.batch_size]
            yield [(i, self.epoch, self.seed) for i in chunk]
        self.start_batch = 0  # only the resumed epoch starts in the middle


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

    def __init__(self, dataset_len: int, batch_size: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0) -> None:
        self.shard = eval_shard(dataset_len, rank, world_size, batch_size)
        self.batch_size = batch_size
        self.seed = seed

    def __len__(self) -> int:
        return -(-len(self.shard) // self.batch_size)

    def __iter__(self) -> Iterator[List[Item]]:
        for start in range(0, len(self.shard), self.batch_size):
            yield [(i, 0, self.seed) for i in self.shard[start:start + self.batch_size]]
