"""Clean error messages from the tools, also for errors raised inside DataLoader workers."""

from torch.utils.data import DataLoader

from ppdist.cli import error_message
from ppdist.errors import DataError


def _failing_collate(samples):
    raise DataError("samples of one batch have different sizes: use batch_size_per_card: 1")


def test_worker_error_keeps_only_the_original_message():
    try:
        list(DataLoader([1, 2], batch_size=2, collate_fn=_failing_collate, num_workers=1))
    except DataError as exc:
        assert "Traceback" in str(exc)  # what torch re-raises
        assert error_message(exc) == "samples of one batch have different sizes: use batch_size_per_card: 1"
    else:  # pragma: no cover
        raise AssertionError("the loader did not fail")


def test_plain_errors_are_unchanged():
    assert error_message(DataError("missing file x.png")) == "missing file x.png"
