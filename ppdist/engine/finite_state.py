"""Whether a model's state (weights, buffers, the EMA's) is finite: what a checkpoint or an
evaluation needs before it trusts the model.

One fused device check per device (the max-abs norm of every floating tensor, which never
overflows), read once on the host; only when it fails are the tensors counted one by one to say
which are not finite.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import torch
from torch import nn

NonFinite = List[Tuple[str, int, int]]  # (name, non-finite values, values)


def nonfinite_tensors(named: Mapping[str, torch.Tensor]) -> NonFinite:
    """``(name, non-finite count, size)`` of each floating tensor of ``named`` holding a NaN or Inf
    (empty when all are finite: one host read per device)."""
    by_device: Dict[torch.device, List[Tuple[str, torch.Tensor]]] = {}
    for name, tensor in named.items():
        if torch.is_tensor(tensor) and tensor.is_floating_point() and tensor.numel():
            by_device.setdefault(tensor.device, []).append((name, tensor.detach()))
    found: NonFinite = []
    for entries in by_device.values():
        norms = torch._foreach_norm([tensor for _, tensor in entries], float("inf"))
        if bool(torch.stack([norm.float() for norm in norms]).isfinite().all()):
            continue
        for name, tensor in entries:
            count = int((~tensor.isfinite()).sum())
            if count:
                found.append((name, count, tensor.numel()))
    return found


def model_state(model: nn.Module, ema_model: Optional[nn.Module] = None) -> Dict[str, torch.Tensor]:
    """The tensors a checkpoint saves of ``model`` and of its EMA copy (named ``ema.<name>``)."""
    named = dict(model.state_dict())
    if ema_model is not None:
        named.update({f"ema.{name}": tensor for name, tensor in ema_model.state_dict().items()})
    return named


def describe(found: NonFinite, shown: int = 3) -> str:
    """``"2 tensor(s) hold NaN/Inf values (a.weight: 3 of 9, b.running_var: 4 of 4)"``."""
    names = ", ".join(f"{name}: {count} of {size}" for name, count, size in found[:shown])
    more = f", and {len(found) - shown} more" if len(found) > shown else ""
    return f"{len(found)} tensor(s) hold NaN/Inf values ({names}{more})"


def state_dict_nonfinite(state: Mapping[str, object], keys: Iterable[str] = ("model", "ema")) -> NonFinite:
    """The non-finite tensors of a loaded checkpoint ``state``: its ``model`` (or the state itself
    when it is a bare state dict) and its EMA module's."""
    named: Dict[str, torch.Tensor] = {}
    if not any(key in state for key in keys):
        named.update({k: v for k, v in state.items() if torch.is_tensor(v)})
    model = state.get("model")
    if isinstance(model, Mapping):
        named.update({k: v for k, v in model.items() if torch.is_tensor(v)})
    ema = state.get("ema")
    module = ema.get("module") if isinstance(ema, Mapping) else None
    if isinstance(module, Mapping):
        named.update({f"ema.{k}": v for k, v in module.items() if torch.is_tensor(v)})
    return nonfinite_tensors(named)


def _float_tensors(obj: Any) -> List[torch.Tensor]:
    if torch.is_tensor(obj):
        return [obj.detach()] if obj.is_floating_point() and obj.numel() else []
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _float_tensors(item)]
    return []


def any_nonfinite(outputs: Any) -> Optional[torch.Tensor]:
    """A device bool: some floating tensor of ``outputs`` (a tensor, or dicts / lists / tuples of
    them: a model's predictions) holds a NaN or Inf; None without floating tensors. No host read."""
    tensors = _float_tensors(outputs)
    if not tensors:
        return None
    device = tensors[0].device
    norms = torch._foreach_norm(tensors, float("inf"))
    return ~torch.stack([n.float().to(device) for n in norms]).isfinite().all()
