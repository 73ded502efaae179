"""Strict JSON for every file (and line) ppdist writes: what ``json.dumps`` writes, with the
non-finite floats that it would write as ``NaN`` / ``Infinity`` (not JSON: other readers refuse
them) written as ``null``. A score that does not exist, e.g. that of an empty table structure,
reads back as ``None``."""

from __future__ import annotations

import json
import math
from typing import IO, Any, Callable, Optional


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (numpy's too) replaced by None, in dicts, lists and
    tuples (tuples become lists, as JSON writes them)."""
    if isinstance(value, float):  # numpy.float64 too
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    if type(value).__module__ == "numpy" and getattr(value, "dtype", None) is not None:
        if value.dtype.kind == "f" and getattr(value, "ndim", 1) == 0:  # numpy.float32 / float16
            return float(value) if math.isfinite(float(value)) else None
    return value


def _finite_default(default: Optional[Callable[[Any], Any]]) -> Optional[Callable[[Any], Any]]:
    """``default``, its results made finite too (None stays None: json's TypeError)."""
    if default is None:
        return None
    return lambda value: finite(default(value))


def dumps(value: Any, *, default: Optional[Callable[[Any], Any]] = None, **kwargs: Any) -> str:
    """``json.dumps(value, **kwargs)`` as strict JSON: non-finite floats as null."""
    return json.dumps(finite(value), allow_nan=False, default=_finite_default(default), **kwargs)


def dump(
    value: Any, handle: IO[str], *, default: Optional[Callable[[Any], Any]] = None, **kwargs: Any
) -> None:
    """``json.dump(value, handle, **kwargs)`` as strict JSON: non-finite floats as null."""
    json.dump(finite(value), handle, allow_nan=False, default=_finite_default(default), **kwargs)
