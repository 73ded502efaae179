"""Samplers: shared permutation, sharding, resume offset, exact eval shards."""

import pytest

from ppdist.data.samplers import EvalBatchSampler, TrainBatchSampler, eval_shard


def indices(batches):
    return [i for batch in batches for (i, *_) in batch]


@pytest.mark.parametrize("n,world", [(10, 1), (10, 2), (11, 2), (7, 3), (2, 4)])
def test_train_shards_cover_dataset_with_equal_lengths(n, world):
    samplers = [TrainBatchSampler(n, 2, r, world, shuffle=True, seed=5) for r in range(world)]
    per_rank = [indices(list(s)) for s in samplers]
    assert len({len(p) for p in per_rank}) == 1  # lockstep: same number of samples
    assert set().union(*map(set, per_rank)) == set(range(n))
    assert len({len(list(s)) for s in samplers}) == 1


def test_permutation_depends_on_seed_and_epoch_only():
    a, b = TrainBatchSampler(50, 4, shuffle=True, seed=1), TrainBatchSampler(50, 4, shuffle=True, seed=1)
    assert list(a) == list(b)
    b.set_epoch(1)
    assert indices(a) != indices(b)
    assert TrainBatchSampler(50, 4, shuffle=False).rank_indices() == list(range(50))


def test_items_carry_epoch_seed_and_the_step_of_the_epoch():
    s = TrainBatchSampler(8, 4, shuffle=True, seed=9)
    s.set_epoch(3)
    assert [[(e, seed, step) for (_, e, seed, step) in batch] for batch in s] == [
        [(3, 9, 0)] * 4,
        [(3, 9, 1)] * 4,
    ]


def test_every_rank_and_micro_batch_of_a_step_has_the_same_step_whatever_the_layout():
    """2 processes x 2 micro-batches, 4 processes, and resumed mid-epoch: step k is step k."""

    def steps(world, accumulate, consumed=0):
        samplers = [
            TrainBatchSampler(96, 3, r, world, seed=1, accumulate_steps=accumulate) for r in range(world)
        ]
        for sampler in samplers:
            sampler.set_position(consumed)
        per_rank = [[{item[3] for item in batch} for batch in sampler] for sampler in samplers]
        assert all(len(steps) == 1 for rank in per_rank for steps in rank)
        micro = [[steps.pop() for steps in rank] for rank in per_rank]
        assert all(rank == micro[0] for rank in micro)  # every rank, every micro-batch
        return micro[0][::accumulate]

    assert steps(4, 1) == steps(2, 2) == steps(1, 4) == list(range(8))
    assert steps(2, 2, consumed=3 * 12) == steps(4, 1, consumed=3 * 12) == list(range(3, 8))


def _global_batches(samplers):
    """The steps of all ranks together: step k is the concatenation of every rank's batch k."""
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1  # lockstep
    return [[i for rank in per_rank for (i, *_) in rank[k]] for k in range(len(per_rank[0]))]


def test_resume_offset_continues_with_next_unseen_batch():
    full = TrainBatchSampler(40, 3, rank=1, world_size=2, shuffle=True, seed=2)
    full.set_epoch(4)
    expected = list(full)
    resumed = TrainBatchSampler(40, 3, rank=1, world_size=2, shuffle=True, seed=2)
    resumed.set_epoch(4)
    resumed.set_position(3 * resumed.samples_per_step)  # three steps of 2 ranks x 3 samples done
    assert resumed.remaining_batches() == len(expected) - 3
    assert list(resumed) == expected[3:]
    assert len(resumed) == len(expected)
    assert list(resumed) == expected  # the position applies to one epoch only


def test_steps_consume_a_prefix_of_the_epoch_permutation():
    samplers = [TrainBatchSampler(23, 2, r, 3, shuffle=True, seed=7) for r in range(3)]
    order = samplers[0].epoch_order()
    consumed = [i for step in _global_batches(samplers) for i in step]
    assert sorted(set(consumed)) == list(range(23))
    # a step covers the next batch_size * world_size positions of the permutation (rank-interleaved)
    assert sorted(consumed[:6]) == sorted(order[:6]) and sorted(consumed[6:12]) == sorted(order[6:12])


@pytest.mark.parametrize(
    "old_world,old_batch,new_world,new_batch,steps_done,drop_last",
    [
        (2, 3, 3, 3, 4, False),
        (2, 3, 1, 3, 5, False),
        (4, 2, 3, 5, 2, False),
        (1, 4, 2, 4, 3, False),
        (3, 2, 2, 2, 3, True),
        (2, 4, 4, 4, 6, True),
    ],
)
def test_position_maps_onto_another_world_size_without_repeats_or_gaps(
    old_world, old_batch, new_world, new_batch, steps_done, drop_last
):
    n, seed, epoch = 61, 3, 2
    old = [
        TrainBatchSampler(n, old_batch, r, old_world, shuffle=True, seed=seed, drop_last=drop_last)
        for r in range(old_world)
    ]
    for s in old:
        s.set_epoch(epoch)
    before = [i for step in _global_batches(old)[:steps_done] for i in step]
    consumed = steps_done * old[0].samples_per_step
    new = [
        TrainBatchSampler(n, new_batch, r, new_world, shuffle=True, seed=seed, drop_last=drop_last)
        for r in range(new_world)
    ]
    for s in new:
        s.set_epoch(epoch)
        s.set_position(consumed)
    expected_steps = new[0].remaining_batches()
    after_steps = _global_batches(new)
    assert len(after_steps) == expected_steps
    after = [i for step in after_steps for i in step]
    assert len(set(before)) == len(before) == consumed  # nothing trained twice before the switch
    real_after = set(after) - set(before)
    if not drop_last:
        assert set(before) | real_after == set(range(n))  # nothing skipped
        padding = len(after) - len(real_after)
        assert padding < new_world  # only the lockstep padding repeats a sample
    else:
        leftover = set(range(n)) - set(before) - real_after
        assert len(leftover) < new[0].samples_per_step  # drop_last drops less than one global batch
        assert len(after) - len(real_after) < new_world  # lockstep padding only


def test_drop_last():
    s = TrainBatchSampler(10, 4, drop_last=True, shuffle=False)
    assert len(s) == 2 and all(len(b) == 4 for b in s)
    s = TrainBatchSampler(10, 4, drop_last=False, shuffle=False)
    assert len(s) == 3 and [len(b) for b in s] == [4, 4, 2]


@pytest.mark.parametrize("n,world", [(0, 2), (1, 2), (7, 2), (11, 3), (100, 7)])
def test_eval_shards_contiguous_no_duplicates(n, world):
    shards = [eval_shard(n, r, world) for r in range(world)]
    flat = [i for s in shards for i in s]
    assert flat == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    batches = [indices(EvalBatchSampler(n, 3, r, world)) for r in range(world)]
    assert [i for b in batches for i in b] == list(range(n))
    single = [list(batch) for batch in EvalBatchSampler(n, 3, 0, 1)]
    split = [list(batch) for r in range(world) for batch in EvalBatchSampler(n, 3, r, world)]
    assert split == single  # the same batches as one process, dealt out in contiguous runs
    sizes = [len(eval_shard(n, r, world, 3)) for r in range(world)]
    assert max(sizes) - min(sizes) < 2 * 3  # one batch, plus a short last batch


def test_an_absurd_accumulate_steps_yields_micro_batches_without_building_the_step():
    """accumulate_steps 1e12 with drop_last false: the first micro-batches come at once, in memory
    proportional to the data set (was: a list of 1e12 indices, 4.4 GB in 20 s)."""
    import time
    import tracemalloc

    sampler = TrainBatchSampler(50, 4, shuffle=True, seed=1, drop_last=False, accumulate_steps=10**12)
    order = sampler.epoch_order()
    tracemalloc.start()
    start = time.perf_counter()
    batches = iter(sampler)
    first = [next(batches) for _ in range(3)]
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert indices(first) == order[:3] and elapsed < 5.0 and peak < 1_000_000, (elapsed, peak)
    assert sampler.steps_per_epoch == 1 and len(sampler) == 10**12


@pytest.mark.parametrize("n,batch,world,drop_last", [(50, 4, 1, False), (50, 4, 2, True), (7, 2, 3, False)])
def test_largest_accumulate_steps_is_the_batches_of_an_epoch(n, batch, world, drop_last):
    from ppdist.data.samplers import max_accumulate_steps

    largest = max_accumulate_steps(n, batch, world, drop_last)
    assert largest == TrainBatchSampler(n, batch, 0, world, drop_last=drop_last).steps_per_epoch
    assert (
        TrainBatchSampler(n, batch, 0, world, drop_last=drop_last, accumulate_steps=largest).steps_per_epoch
        == 1
    )
