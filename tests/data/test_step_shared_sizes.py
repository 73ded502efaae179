"""One multi-scale size per optimizer step for the whole job (docs/architecture.md, "Every rank
does the same work": no rank waits for another's larger image): BatchRandomResize draws from (seed, epoch, step), so every rank and micro-batch of a
step gets the same size, whatever the layout, and a resumed run draws the sizes it would have."""

import pytest
from ppdist_testing import tiny_det_config

from ppdist.config import load_config
from ppdist.data.build import build_dataloader
from ppdist.engine.dist import DistEnv
from ppdist.engine.prepare import ensure_synthetic_data

SIZES = [64, 80, 96, 112, 128]
BATCH = 3


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shared_sizes")
    path = tiny_det_config(str(folder / "c.yml"), str(folder / "data"), str(folder / "out"), num_train=36)
    config = load_config(
        path,
        [
            f"Train.dataset.batch_transforms.0.BatchRandomResize.target_size={SIZES}",
            "Train.dataset.batch_transforms.0.BatchRandomResize.random_interp=true",
            f"Train.loader.batch_size_per_card={BATCH}",
            "Train.loader.num_workers=0",
        ],
    )
    ensure_synthetic_data(config, DistEnv())
    return config


def step_sizes(config, world, accumulate=1, rank=0, epoch=0, consumed=0):
    """(height, width) of each micro-batch one rank's loader yields in ``epoch`` from ``consumed``."""
    config = dict(config, Global=dict(config["Global"], accumulate_steps=accumulate))
    loader = build_dataloader(config, "Train", "train", rank, world)
    loader.batch_sampler.set_epoch(epoch)
    loader.batch_sampler.set_position(consumed)
    return [tuple(batch["image"].shape[-2:]) for batch in loader]


def test_every_rank_draws_the_same_size_at_every_step(config):
    for epoch in (0, 1):
        rank0, rank1 = (step_sizes(config, 2, rank=rank, epoch=epoch) for rank in (0, 1))
        assert rank0 == rank1 and len(rank0) >= 4
        assert len(set(rank0)) > 1  # the size still changes from step to step
    assert step_sizes(config, 2, epoch=0) != step_sizes(config, 2, epoch=1)


def test_micro_batches_of_a_step_share_its_size_and_layouts_agree(config):
    two_processes = step_sizes(config, 2)
    accumulated = step_sizes(config, 1, accumulate=2)
    assert accumulated[0::2] == accumulated[1::2] == two_processes
    four = [step_sizes(config, 4, rank=rank) for rank in range(4)]
    two_by_two = [step_sizes(config, 2, accumulate=2, rank=rank)[0::2] for rank in range(2)]
    assert all(sizes == four[0] for sizes in four + two_by_two)


def test_a_resumed_epoch_draws_the_sizes_of_the_uninterrupted_run(config):
    whole = step_sizes(config, 2, rank=1, epoch=1)
    samples_per_step = 2 * BATCH
    for done in (1, 4):
        assert step_sizes(config, 2, rank=1, epoch=1, consumed=done * samples_per_step) == whole[done:]
        # resumed with another layout of the same global batch: the same steps, the same sizes
        assert (
            step_sizes(config, 1, accumulate=2, epoch=1, consumed=done * samples_per_step)[0::2]
            == whole[done:]
        )
