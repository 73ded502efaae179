"""What a model's output classes mean, recorded in the checkpoints ppdist writes and checked when
one is evaluated, exported or resumed.

A recognition head's classes are the characters of a dictionary: a checkpoint evaluated with a
dictionary of the same size but other characters loads without a shape mismatch and decodes every
prediction with the wrong characters. The record (``CLASSES_KEY``: ``{"classes": [...],
"dictionary": path or None, "key": the config key naming it}``) is made by
``ppdist.components.class_vocabulary`` from the post-process, for any task whose post-process
has a class list; this module only compares records and reads class counts from tensor shapes.
Checkpoints without a record (older ones, converted Paddle weights) load as before.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from ppdist.errors import ConfigError

CLASSES_KEY = "classes"


def describe_dictionary(record: Mapping[str, Any]) -> str:
    """``<key> <path>`` or the default dictionary, as a message names it."""
    path = record.get("dictionary")
    return f"{record.get('key') or 'dictionary'} {path}" if path else "the default dictionary (0-9a-z)"


def check_classes(
    saved: Optional[Mapping[str, Any]], current: Optional[Mapping[str, Any]], source: str
) -> None:
    """``ConfigError`` when the checkpoint ``source`` recorded other classes (``saved``) than the
    config gives (``current``): another count (the head's size comes from the dictionary) or the
    same count with other characters. Nothing to compare when either record is missing."""
    if not saved or not current:
        return
    old, new = list(saved.get("classes") or []), list(current.get("classes") or [])
    if old == new:
        return
    theirs = f"its dictionary, {saved.get('dictionary') or 'the default dictionary (0-9a-z)'}"
    ours = describe_dictionary(current)
    if len(old) != len(new):
        raise ConfigError(
            f"{source} was trained with {len(old)} classes ({theirs}) and this config gives {len(new)}: the "
            f"head's class count comes from the dictionary ({ours}); evaluate, export or resume it with the "
            f"checkpoint's dictionary"
        )
    index = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    differ = sum(a != b for a, b in zip(old, new))
    raise ConfigError(
        f"{source} was trained with other classes than this config's: {theirs}, and {ours} both have "
        f"{len(old)} classes but {differ} differ (class {index} is {old[index]!r} in the checkpoint, "
        f"{new[index]!r} here), so its predictions would be read as the wrong characters; set "
        f"{current.get('key') or 'the dictionary'} to the checkpoint's dictionary"
    )


def checkpoint_class_count(own: Mapping[str, Any], state: Mapping[str, Any], count: int) -> Optional[int]:
    """The class count of the checkpoint ``state`` when it differs from the model's ``count``: the
    size, in the first tensor whose shape differs from the model's (``own``), of an axis that has
    ``count`` entries in the model. None when no tensor tells."""
    for key, value in own.items():
        other = state.get(key)
        if (
            not (isinstance(other, torch.Tensor) and isinstance(value, torch.Tensor))
            or other.dim() != value.dim()
        ):
            continue
        for ours, theirs in zip(value.shape, other.shape):
            if ours == count and theirs != count:
                return int(theirs)
    return None


def class_count_hint(
    own: Mapping[str, Any], state: Mapping[str, Any], current: Optional[Mapping[str, Any]]
) -> str:
    """``; the head's class count comes from the dictionary (...): N here, M in the checkpoint``
    when the shapes of ``state`` tell another class count than the config's record, else ''."""
    if not current or not current.get("classes"):
        return ""
    count = len(current["classes"])
    theirs = checkpoint_class_count(
        own, {k[7:] if k.startswith("module.") else k: v for k, v in state.items()}, count
    )
    if theirs is None:
        return ""
    return (
        f"; the head's class count comes from the dictionary ({describe_dictionary(current)}: {count} classes) "
        f"and the checkpoint's head has {theirs}: use the dictionary it was trained with"
    )
