"""The next batch's host-to-device copy overlapped with the current step (CUDA).

``DevicePrefetcher`` iterates a loader one batch ahead: while the trainer computes step ``k`` on
the default stream, batch ``k + 1`` is copied from pinned memory on a side stream (and whatever
else ``move`` does on the device: normalisation, layout). Before a batch is handed out the current
stream waits for the side stream (a device-side wait, not a host one), and each of the batch's
tensors is marked as used by the current stream (``record_stream``), so the caching allocator does
not give its memory to another tensor while the step still reads it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, Optional

import torch
from torch.utils._pytree import tree_flatten

Batch = Dict[str, Any]


class DevicePrefetcher:
    """``for batch in DevicePrefetcher(loader, move, stream)``: ``move(batch)`` of each batch of
    ``loader``, computed one batch ahead on ``stream`` (a ``torch.cuda.Stream``; None: on the
    current stream, i.e. only one ahead — for tests and devices without streams)."""

    def __init__(self, batches: Iterable[Batch], move: Callable[[Batch], Batch], stream: Any = None) -> None:
        self.batches = iter(batches)
        self.move = move
        self.stream = stream
        self.ahead: Optional[Batch] = None
        self.done = False
        self._load()

    @classmethod
    def for_device(
        cls, batches: Iterable[Batch], move: Callable[[Batch], Batch], device: torch.device
    ) -> Any:
        """A prefetcher with a side stream on CUDA; elsewhere the plain iterator (no streams to
        overlap with: ``move`` then runs as each batch is used)."""
        if device.type != "cuda":
            return iter(batches)
        return cls(batches, move, torch.cuda.Stream(device))

    def _load(self) -> None:
        batch = next(self.batches, None)
        if batch is None:
            self.ahead, self.done = None, True
            return
        if self.stream is None:
            self.ahead = self.move(batch)
            return
        with torch.cuda.stream(self.stream):
            self.ahead = self.move(batch)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self.done:
            raise StopIteration
        batch = self.ahead
        if self.stream is not None:
            current = torch.cuda.current_stream(self.stream.device)
            current.wait_stream(self.stream)
            for leaf in tree_flatten(batch)[0]:
                if isinstance(leaf, torch.Tensor) and leaf.is_cuda:
                    leaf.record_stream(current)
        self._load()
        return batch
