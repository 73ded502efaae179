"""RunPosition: the run's place in its epochs, moved step by step and carried to another layout."""

from __future__ import annotations

import pytest

from ppdist.data.samplers import TrainBatchSampler
from ppdist.engine.position import Layout, RunPosition, run_length


def sampler(batch: int = 16, world: int = 1, dataset: int = 512, drop_last: bool = True) -> TrainBatchSampler:
    return TrainBatchSampler(
        dataset, batch, rank=0, world_size=world, shuffle=True, drop_last=drop_last, seed=3
    )


def position_at(step: int, layout_sampler: TrainBatchSampler, iteration_based: bool = False) -> RunPosition:
    position = RunPosition(Layout.of(layout_sampler), iteration_based)
    for _ in range(step):
        position.advance()
    return position


def test_run_length_in_epochs_or_steps():
    assert run_length(8, None, 375) == (8, 3000)
    assert run_length(None, 1000, 375) == (3, 1000)  # the last epoch is a partial one
    assert run_length(5, 600, 100) == (6, 600)  # max_iters wins


def test_layout_of_a_sampler():
    layout = Layout.of(sampler(batch=16, world=2, dataset=100))
    assert layout == Layout(dataset_len=100, batch_size=16, world_size=2, steps_per_epoch=3)
    assert layout.samples_per_step == 32


def test_advance_counts_steps_and_samples_and_rolls_over_at_the_epoch_end():
    position = RunPosition(Layout.of(sampler()))  # 32 steps of 16
    ends = [position.advance() for _ in range(31)]
    assert not any(ends)
    assert (position.next_epoch, position.next_batch, position.epoch_consumed, position.global_step) == (
        1,
        31,
        496,
        31,
    )
    assert position.completed_epoch == 1
    assert position.advance() is True  # the last batch finishes the epoch at once
    assert (position.next_epoch, position.next_batch, position.epoch_consumed, position.global_step) == (
        2,
        0,
        0,
        32,
    )
    assert position.completed_epoch == 1


def test_enter_epoch_points_the_sampler_at_the_next_unseen_batch():
    train = sampler()
    position = position_at(12, train)
    position.enter_epoch(train)
    assert (train.epoch, train.consumed, train.remaining_batches()) == (1, 192, 20)


def test_state_round_trip_and_the_saved_layout():
    train = sampler()
    position = position_at(45, train)
    state = position.state_dict()
    assert state == {
        "next_epoch": 2,
        "next_batch": 13,
        "epoch_consumed": 208,
        "global_step": 45,
        "dataset_len": 512,
        "batch_size_per_card": 16,
        "world_size": 1,
        "steps_per_epoch": 32,
        "accumulate_steps": 1,
    }
    restored = RunPosition(Layout.of(train))
    restored.load_state_dict(state)
    assert restored.state_dict() == state and restored.saved_layout(state) == restored.layout
    old = {
        k: v
        for k, v in state.items()
        if k not in ("epoch_consumed", "batch_size_per_card", "dataset_len", "accumulate_steps")
    }
    restored.load_state_dict(old)  # ppdist 0.1 files: the sample position follows from the batch
    assert restored.epoch_consumed == 13 * 16 and restored.saved_layout(old) == restored.layout


@pytest.mark.parametrize(
    "batch, world, iteration_based, expected",
    [
        (8, 1, False, (24, 24, 40)),  # 320 samples left = 40 batches of 8 in a 64-batch epoch
        (8, 1, True, (24, 12, 40)),  # max_iters runs keep their step count
        (16, 2, False, (6, 6, 10)),  # 320 left over 2 processes x 16 = 10 of 16 steps
    ],
)
def test_relayout_continues_the_epoch_from_the_same_sample(batch, world, iteration_based, expected):
    saved = position_at(12, sampler(batch=16)).state_dict()  # epoch 1 after 192 of 512 samples
    target = sampler(batch=batch, world=world)
    position = RunPosition(Layout.of(target), iteration_based)
    position.load_state_dict(saved)
    left = position.relayout(target)
    assert (position.next_batch, position.global_step, left) == expected
    assert (position.next_epoch, position.epoch_consumed) == (1, 192)
    assert (target.epoch, target.consumed) == (1, 192)
    steps = 0
    while not position.advance():
        steps += 1
    assert steps + 1 == left and position.next_epoch == 2  # the epoch ends after exactly the batches left


def test_relayout_can_leave_no_batch_in_the_epoch():
    saved = position_at(5, sampler(batch=16, dataset=100)).state_dict()  # 80 of 100 used
    target = sampler(batch=32, dataset=100)  # drop_last: the 20 samples left give no batch of 32
    position = RunPosition(Layout.of(target))
    position.load_state_dict(saved)
    assert position.relayout(target) == 0
    assert position.next_batch == position.layout.steps_per_epoch == 3  # the trainer finishes the epoch
    assert (position.next_epoch, position.global_step) == (1, 3)
