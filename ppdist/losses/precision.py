"""Losses, assigners and metrics compute in fp32 whatever the autocast state around them."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])
_AUTOCAST_DEVICES = ("cuda", "cpu")


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Switch off every autocast that is on (CUDA and CPU); a no-op when none is."""
    with contextlib.ExitStack() as stack:
        for device_type in _AUTOCAST_DEVICES:
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def full_precision(fn: F) -> F:
    """Decorator: ``fn`` runs with autocast off (its inputs still need ``.float()``)."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with autocast_off():
            return fn(*args, **kwargs)

    return wrapped  # type: ignore[return-value]
