"""Nested settings of a head (``RPNHead.train_proposal``, ``BBoxHead.roi_extractor``, ...)
checked against the class they build: an unknown key is one line naming its path."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Mapping, Optional

from ppdist.registry import did_you_mean


def checked_settings(
    target: Callable[..., Any], values: Optional[Mapping[str, Any]], where: str
) -> Dict[str, Any]:
    """``values`` as a dict after checking every key is a keyword of ``target``; ``where`` is the
    key path (``RPNHead.train_proposal``)."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{where} must be a mapping of {target.__name__} settings, got {values!r}")
    accepted = [name for name in inspect.signature(target).parameters if name != "self"]
    for key in values:
        if key not in accepted:
            raise ValueError(
                f"{where}.{key} is not a {target.__name__} setting.{did_you_mean(key, accepted)}"
            )
    return dict(values)
