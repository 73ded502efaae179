"""Samplers: shared permutation, sharding, resume offset, exact eval shards."""
import pytest

from ppdist.data.samplers import EvalBatchSampler, TrainBatchSampler, eval_shard


def indices(batches):
    return [i for batch in batches for (i, _, _) in batch]


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


def test_items_carry_epoch_and_seed():
    s = TrainBatchSampler(8, 4, shuffle=True, seed=9)
    s.set_epoch(3)
    assert all(e == 3 and seed == 9 for batch in s for (_, e, seed) in batch)


def test_resume_offset_continues_with_next_unseen_batch():
    full = TrainBatchSampler(40, 3, rank=1, world_size=2, shuffle=True, seed=2)
    full.set_epoch(4)
    expected = list(full)
    resumed = TrainBatchSampler(40, 3, rank=1, world_size=2, shuffle=True, seed=2)
    resumed.set_epoch(4)
    resumed.set_start_batch(3)
    assert list(resumed) == expected[3:]
    assert len(resumed) == len(expected)
    assert list(resumed) == expected  # the offset applies to one epoch only


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
