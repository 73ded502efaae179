"""RNG streams: CPU seeding, keeping the streams around a block, capture/restore."""

import random

import numpy as np
import torch

from ppdist.utils.rng import (
    capture_rng_state,
    kept_cpu_rng_streams,
    restore_rng_state,
    seed_cpu_rngs,
    seed_everything,
)


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_seed_cpu_rngs_matches_seeding_each_stream():
    seed_cpu_rngs(123)
    ours = draws()
    random.seed(123), np.random.seed(123), torch.manual_seed(123)
    assert ours == draws()


def test_kept_streams_continue_as_if_the_block_never_ran():
    seed_everything(7)
    expected = draws()
    seed_everything(7)
    with kept_cpu_rng_streams():
        seed_cpu_rngs(99)
        draws()
    assert draws() == expected


def test_kept_streams_are_restored_after_an_exception():
    seed_everything(3)
    expected = draws()
    seed_everything(3)
    try:
        with kept_cpu_rng_streams():
            draws()
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert draws() == expected


def test_capture_and_restore():
    seed_everything(11)
    state = capture_rng_state()
    expected = draws()
    draws()
    restore_rng_state(state)
    assert draws() == expected
