"""A checkpoint's state copied to host memory, so that a background thread can write it while the
training changes the original in place.

On CUDA each tensor is copied without blocking into a pinned host buffer (kept from one save to
the next: pinned memory is slow to allocate) and one event per device marks the copies' end, which
the writer waits for; the step's path only issues the copies. On the CPU each tensor is cloned. A
tensor that appears twice in the state (tied weights) is copied once, so the file keeps sharing it.
Containers (dicts, ordered dicts with their ``_metadata``, lists, tuples) are rebuilt, other values
deep-copied.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, Dict, Hashable, List, Tuple

import torch

Key = Tuple[Hashable, ...]


class HostCopier:
    """Copies checkpoint states to host memory; keeps the pinned buffers of the last CUDA copy.

    A buffer is reused by the next copy, so the state of one copy must be written (or dropped)
    before the next copy starts: the background writer's one write in flight guarantees it.
    """

    def __init__(self) -> None:
        self._buffers: Dict[Key, torch.Tensor] = {}

    def copy(self, state: Any) -> Tuple[Any, List[torch.cuda.Event]]:
        """``(host copy of state, events)``: the copy is whole once every event has completed
        (no event for a state without CUDA tensors)."""
        memo: Dict[int, torch.Tensor] = {}
        devices: Dict[torch.device, None] = {}
        host = self._visit(state, (), memo, devices)
        events = []
        for device in devices:
            with torch.cuda.device(device):
                event = torch.cuda.Event()
                event.record()
                events.append(event)
        return host, events

    def clear(self) -> None:
        """Give the pinned buffers back."""
        self._buffers.clear()

    def _visit(self, obj: Any, key: Key, memo: Dict[int, torch.Tensor], devices: Dict[Any, None]) -> Any:
        if isinstance(obj, torch.Tensor):
            if id(obj) not in memo:
                memo[id(obj)] = self._tensor(obj.detach(), key, devices)
            return memo[id(obj)]
        if type(obj) in (dict, OrderedDict):
            copied = type(obj)((k, self._visit(v, key + (k,), memo, devices)) for k, v in obj.items())
            if hasattr(obj, "__dict__"):  # an OrderedDict's attributes: a state dict's _metadata
                copied.__dict__.update(copy.deepcopy(obj.__dict__))
            return copied
        if type(obj) in (list, tuple):
            return type(obj)(self._visit(v, key + (i,), memo, devices) for i, v in enumerate(obj))
        return copy.deepcopy(obj)

    def _tensor(self, tensor: torch.Tensor, key: Key, devices: Dict[Any, None]) -> torch.Tensor:
        if tensor.device.type not in ("cpu", "cuda"):
            return tensor.to("cpu")  # another accelerator: a blocking copy
        on_cuda = tensor.device.type == "cuda"
        buffer = self._buffers.get(key)
        if buffer is None or (buffer.shape, buffer.dtype, buffer.stride()) != (
            tensor.shape,
            tensor.dtype,
            tensor.stride(),
        ):
            buffer = torch.empty_like(tensor, device="cpu", pin_memory=on_cuda)
            self._buffers[key] = buffer
        buffer.copy_(tensor, non_blocking=on_cuda)
        if on_cuda:
            devices[tensor.device] = None
        return buffer
