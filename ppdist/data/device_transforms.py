"""Image work a loader leaves to the device: the trailing normalisation of a pipeline (and its
HWC -> CHW layout change), so that images travel as uint8 (4x fewer bytes through shared memory,
pinning and the host-to-device copy; segmentation labels likewise travel as read and are cast to
int64 there) and the arithmetic runs where it is cheap.

An op that can run on the device says how, with ``device_steps()``: elementwise steps
``("mul" | "sub" | "div", per-channel values)`` in the order it computes them in float32, or
``[("to_chw", ())]`` for a layout change. ``defer_to_device`` takes the trailing run of such ops
off a pipeline (ops that declare ``touches_image = False``, e.g. ``PadGT``, may sit between them
and stay where they are) and returns one ``DeviceTransform``; the collate records it in each
batch (``DEVICE_TRANSFORM_KEY``) and ``ppdist.engine.batch.move_to_device`` applies it after the
copy. Each step is one float32 operation, as numpy computes it on the host, so the result is
bitwise the host's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

Step = Tuple[str, Tuple[float, ...]]
ELEMENTWISE = ("mul", "sub", "div")
# per-channel constants on each device, copied there once per process (a copy of Python numbers
# to a GPU waits for the stream: never per batch)
_CONSTANTS: Dict[Tuple[str, Tuple[float, ...]], torch.Tensor] = {}


def device_constant(values: Tuple[float, ...], device: torch.device) -> torch.Tensor:
    """``values`` as a float32 tensor on ``device``, made once and kept."""
    key = (str(device), values)
    constant = _CONSTANTS.get(key)
    if constant is None:
        constant = _CONSTANTS[key] = torch.tensor(values, dtype=torch.float32).to(device)
    return constant


@dataclass(frozen=True)
class DeviceTransform:
    """uint8 (or float) images -> float32, ``steps`` on the channel axis, then NHWC -> NCHW when
    ``to_chw`` (a permuted view: channels_last memory for free). ``sources`` names the ops it
    stands for; ``key`` is the batch entry it applies to; ``casts`` (key, torch dtype name) are the
    other entries the dataset left compact (e.g. a uint8 label the loss takes as int64)."""

    steps: Tuple[Step, ...]
    to_chw: bool
    sources: Tuple[str, ...]
    key: str = "image"
    casts: Tuple[Tuple[str, str], ...] = ()

    def cast(self, key: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` of batch entry ``key`` in the dtype the dataset would have given it."""
        for name, dtype in self.casts:
            if name == key:
                return value.to(getattr(torch, dtype))
        return value

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        out = images.to(torch.float32)  # a new tensor: the in-place steps below never touch the input
        if out.data_ptr() == images.data_ptr():
            out = out.clone()
        for name, values in self.steps:
            constant = device_constant(values, out.device)
            if name == "mul":
                out.mul_(constant)
            elif name == "sub":
                out.sub_(constant)
            else:
                out.div_(constant)
        return out.permute(0, 3, 1, 2) if self.to_chw else out


def _steps_of(op: Any) -> Optional[List[Step]]:
    steps = getattr(op, "device_steps", None)
    return None if steps is None else list(steps())


def defer_to_device(
    sample_ops: Sequence[Any], batch_ops: Sequence[Any], layout_in_finish: bool = False
) -> Tuple[List[Any], List[Any], Optional[DeviceTransform]]:
    """``(sample_ops, batch_ops, transform)`` with the pipeline's trailing device-capable ops taken
    off into ``transform`` (None, and the ops unchanged, when there are none).

    The elementwise ops may be followed by one layout change (``Permute``); ``layout_in_finish``
    says the dataset's output layout does that change itself (segmentation: HWC -> CHW) and can
    leave it to the device as well (see ``BaseDataSet.leave_layout_to_device``, whose casts the
    caller adds).
    """
    pipeline = [("sample", op) for op in sample_ops] + [("batch", op) for op in batch_ops]
    taken: List[int] = []
    for position in range(len(pipeline) - 1, -1, -1):
        op = pipeline[position][1]
        if getattr(op, "touches_image", True) is False:
            continue
        steps = _steps_of(op)
        if steps is None:
            break
        is_layout = [name for name, _ in steps] == ["to_chw"]
        if is_layout and taken:  # the steps after it work on the other layout: all stay on the host
            taken = []
            break
        if not is_layout and any(name not in ELEMENTWISE for name, _ in steps):
            break
        taken.insert(0, position)
    if not taken:
        return list(sample_ops), list(batch_ops), None
    steps: List[Step] = []
    to_chw = layout_in_finish
    for position in taken:
        for name, values in _steps_of(pipeline[position][1]) or []:
            if name == "to_chw":
                to_chw = True
            else:
                steps.append((name, tuple(float(v) for v in values)))
    transform = DeviceTransform(tuple(steps), to_chw, tuple(type(pipeline[p][1]).__name__ for p in taken))
    kept = [entry for p, entry in enumerate(pipeline) if p not in taken]
    return (
        [op for where, op in kept if where == "sample"],
        [op for where, op in kept if where == "batch"],
        transform,
    )
