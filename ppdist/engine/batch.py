"""Batch helpers shared by the trainer and the evaluator."""

from __future__ import annotations

from typing import Any, Collection, Dict, Mapping

import torch
from torch.utils._pytree import tree_map

from ppdist.data.base import DEVICE_TRANSFORM_KEY


def move_to_device(
    batch: Mapping[str, Any],
    device: torch.device,
    channels_last: bool = False,
    keep_on_host: Collection[str] = (),
) -> Dict[str, Any]:
    """Tensors of ``batch`` on ``device`` (non-blocking), but those named in ``keep_on_host``
    (values a loss needs on the host, e.g. CTC lengths); 4-D float tensors channels_last when
    asked, else contiguous. The work the loader left to the device (``_device_transform``: e.g.
    the normalisation of uint8 images, int64 of uint8 labels) is done here, after the copy."""
    non_blocking = device.type == "cuda"
    transform = batch.get(DEVICE_TRANSFORM_KEY)
    out: Dict[str, Any] = {}
    for key, value in batch.items():
        if key == DEVICE_TRANSFORM_KEY:
            continue
        if isinstance(value, torch.Tensor) and key not in keep_on_host:
            value = value.to(device, non_blocking=non_blocking)
            if transform is not None and key == transform.key:
                value = transform(value)
                if not channels_last:
                    value = value.contiguous()
            elif transform is not None:
                value = transform.cast(key, value)
            if channels_last and value.ndim == 4 and value.is_floating_point():
                value = value.contiguous(memory_format=torch.channels_last)
        out[key] = value
    return out


def batch_size_of(batch: Mapping[str, Any]) -> int:
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0 and not key.startswith("_"):
            return int(value.shape[0])
    return 0


def detach(tree: Any) -> Any:
    """``tree`` (a tensor, or lists/tuples/dicts of them) with every tensor detached."""
    return tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, tree)
