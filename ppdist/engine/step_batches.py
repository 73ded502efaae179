"""The micro-batches of one training step, on the device, with what the step's record keeps of
them (bad samples, notes, sizes, waits for data)."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterator, Optional

from ppdist.data.base import BAD_SAMPLES_KEY, NOTES_KEY
from ppdist.engine.batch import batch_size_of
from ppdist.engine.step_record import StepRecord
from ppdist.errors import DataError

EPOCH_KEY = "epoch_id"  # 0-based epoch in the batch, for epoch-dependent losses (PP-YOLOE's assigner switch)


def step_batches(
    first: Dict[str, Any],
    more_batches: Optional[Iterator[Dict[str, Any]]],
    count: int,
    record: StepRecord,
    to_device: Callable[[Dict[str, Any]], Dict[str, Any]],
    epoch_id: int,
) -> Iterator[Dict[str, Any]]:
    """The ``count`` micro-batches of a step (``first``, then the next of ``more_batches``) moved
    by ``to_device`` and marked with ``epoch_id``; their bad samples, sizes and waits for data go
    into ``record`` (``record.batch``: the last one)."""
    batch = first
    for index in range(count):
        if index:
            wait = time.perf_counter()
            batch = next(more_batches, None) if more_batches is not None else None
            if batch is None:
                raise RuntimeError(
                    f"the training loader ended inside an accumulated step ({index} of {count} "
                    f"micro-batches); its batch sampler must yield whole steps (TrainBatchSampler does)"
                )
            record.reader_cost += time.perf_counter() - wait
        record.bad_samples += batch.pop(BAD_SAMPLES_KEY, [])
        record.notes += batch.pop(NOTES_KEY, [])
        size = batch_size_of(batch)
        if size == 0:  # training replaces a bad sample by any usable one: none is left
            bad = record.bad_samples
            raise DataError(
                f"a training batch has no usable sample: no sample of the training set could be read "
                f"({len(bad)} bad in this batch, e.g. {'; '.join(bad[:3])}); check Train.dataset"
            )
        record.local_samples += size
        batch = to_device(batch)  # (a prefetched batch is there already)
        batch[EPOCH_KEY] = epoch_id
        record.batch = batch
        yield batch
