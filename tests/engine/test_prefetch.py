"""DevicePrefetcher: every batch once, in order, moved one batch ahead of the one handed out."""

import torch

from ppdist.engine.prefetch import DevicePrefetcher


def test_batches_come_in_order_each_moved_one_ahead():
    moved = []

    def move(batch):
        moved.append(int(batch["x"][0]))
        return dict(batch, x=batch["x"] * 10)

    batches = [{"x": torch.tensor([i]), "_bad_samples": []} for i in range(4)]
    prefetcher = DevicePrefetcher(batches, move)
    assert moved == [0]  # the first copy starts before the loop asks
    seen = []
    for batch in prefetcher:
        seen.append(int(batch["x"][0]))
        assert moved[-1] == min(len(seen), 3)  # the next one is already on its way
    assert seen == [0, 10, 20, 30] and moved == [0, 1, 2, 3]
    assert next(iter(prefetcher), None) is None


def test_an_empty_loader_and_the_cpu_need_no_prefetcher():
    assert list(DevicePrefetcher([], lambda b: b)) == []
    batches = [{"x": torch.zeros(1)}]
    plain = DevicePrefetcher.for_device(batches, lambda b: b, torch.device("cpu"))
    assert not isinstance(plain, DevicePrefetcher) and list(plain) == batches
