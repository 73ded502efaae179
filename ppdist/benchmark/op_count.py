"""ATen operators dispatched by one training step: on a GPU each is about one kernel launch, and
the count does not depend on the device, so a CPU count tells how launch-bound a recipe's step is.

``count_step_ops(trainer, batch)`` runs ``trainer.step(batch)`` under a ``TorchDispatchMode`` and
counts every operator that does work, by phase: ``forward`` (inside the model's forward), ``loss``
(inside the loss's forward), ``backward`` (inside autograd's backward) and ``update`` (the rest:
the non-finite watch, gradient clipping, optimizer, LR schedule, EMA). Views and metadata
operators (``is_view``, ``detach``, ``empty*``, sizes and strides) launch nothing and are left out.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ppdist.benchmark.synthetic_step import device_batch, step_trainer

PHASES = ("forward", "loss", "backward", "update")

# operators that allocate or alias without touching data (no kernel launch)
_NO_WORK = {
    "detach",
    "alias",
    "lift_fresh",
    "_unsafe_view",
    "unsafe_split",
    "unsafe_split_with_sizes",
    "set_",
    "is_same_size",
    "_has_compatible_shallow_copy_type",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "resize_",
}


def launches(func: torch._ops.OpOverload) -> bool:
    """Whether ``func`` does work on the data (a kernel launch on a GPU)."""
    name = func.overloadpacket.__name__
    return not (func.is_view or name in _NO_WORK or name.startswith("empty") or name.startswith("new_empty"))


@dataclass
class OpCount:
    """The operators of one step: ``phases`` (name -> count) and ``ops`` (``aten`` name -> count)."""

    phases: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    ops: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.phases.values())

    def top(self, count: int = 10) -> List[Tuple[str, int]]:
        return self.ops.most_common(count)

    def as_dict(self, top: int = 15) -> Dict[str, Any]:
        return {"total": self.total, "phases": dict(self.phases), "top_ops": dict(self.top(top))}


class _Counting(TorchDispatchMode):
    """Counts the working operators dispatched while active, into the phase the step is in."""

    def __init__(self, result: OpCount) -> None:
        super().__init__()
        self.result = result
        self.inside: str = ""  # "forward" or "loss" between the module's pre- and post-hook

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches(func):
            if torch._C._current_graph_task_id() != -1:
                phase = "backward"
            else:
                phase = self.inside or "update"
            self.result.phases[phase] += 1
            self.result.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_step_ops(trainer: Any, batch: Dict[str, Any]) -> OpCount:
    """The working ATen operators of ``trainer.step(batch)`` (``batch`` already on the device), by
    phase. The step is a real one: the model's weights and the optimizer move."""
    result = OpCount()
    mode = _Counting(result)

    def entering(phase: str):
        def hook(*_: Any) -> None:
            mode.inside = phase

        return hook

    def leaving(*_: Any) -> None:
        mode.inside = ""

    handles = []
    for module, phase in ((trainer.model, "forward"), (trainer.loss_fn, "loss")):
        if isinstance(module, torch.nn.Module):
            handles.append(module.register_forward_pre_hook(entering(phase)))
            handles.append(module.register_forward_hook(leaving))
    try:
        with mode:
            trainer.step(batch)
    finally:
        for handle in handles:
            handle.remove()
    return result


def measure_step_ops(
    config: Mapping[str, Any], batch_size: int, size: Tuple[int, int], warmup: int = 2
) -> Dict[str, Any]:
    """The operators of the training step after ``warmup`` steps of ``config``'s parts on synthetic
    batches of ``batch_size`` at ``size`` (``synthetic_step``), with ``Optimizer.fused`` on as on a
    GPU (one launch group for the update instead of a loop over the parameters)."""
    config = copy.deepcopy(dict(config))
    config["Optimizer"] = dict(config["Optimizer"], fused=True)
    trainer = step_trainer(config, batch_size, size, steps=warmup + 1)
    batches = [device_batch(trainer, batch) for batch, _ in zip(trainer.train_loader, range(warmup + 1))]
    for batch in batches[:-1]:
        trainer.step(batch)
    counted = count_step_ops(trainer, batches[-1])
    result = counted.as_dict()
    result.update(batch_size=batch_size, size=list(size), device=str(trainer.env.device), warmup=warmup)
    return result


def format_op_count(name: str, result: Mapping[str, Any]) -> str:
    """The count as a few report lines: total, phases, the most frequent operators."""
    phases = ", ".join(f"{phase} {count:,}" for phase, count in result["phases"].items())
    top = ", ".join(f"{op} {count:,}" for op, count in result["top_ops"].items())
    return (
        f"ATen operators of one training step ({name}, batch {result['batch_size']} at "
        f"{result['size'][0]}x{result['size'][1]}, {result['device']}): {result['total']:,}\n"
        f"  by phase: {phases}\n  most frequent: {top}"
    )
