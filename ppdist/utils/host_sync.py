"""Count the places where the host would wait for the GPU, on any device (CPU included).

``HostSyncCounter`` is a ``TorchDispatchMode`` plus a few patched ``Tensor`` readers. Inside it,
every tensor is a *device* tensor unless it is declared a *host* tensor (``host=``) or was made on
the host: a factory call without a ``device`` argument (or with the string "cpu"), ``torch.tensor``
of Python data likewise, or any op whose tensor inputs are all host tensors. Reading a device tensor's value on the
host is a synchronisation on a GPU, so it is recorded as an ``Event`` even when the run is on CPU:

* ``aten._local_scalar_dense`` (``.item()``, ``float(t)``, ``int(t)``, ``bool(t)``, ``if t:``),
  ``aten.equal``;
* data-dependent output shapes: ``nonzero``, ``masked_select``, ``unique*``, boolean-mask
  indexing (``t[mask]``) and ``index_put`` with a boolean mask, ``repeat_interleave`` without
  ``output_size``;
* CTC with device-side lengths (ATen copies them to the host);
* ``Tensor.tolist()/.numpy()/.cpu()/__array__`` of a device tensor;
* a blocking host-to-device copy: ``torch.tensor(python_data, device=...)``, or ``.to(device)`` /
  ``.cuda()`` of a host tensor without ``non_blocking=True``.

What it cannot see: ops implemented in C++ that read values without dispatching (none in
ppdist's training step is known), and pinned-memory subtleties. ``torch.cuda.set_sync_debug_mode``
is the check on real hardware (the CUDA test suite uses both).
"""

from __future__ import annotations

import sys
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

# ops that make the host wait for the device whatever their arguments
_ALWAYS_SYNC = {
    aten._local_scalar_dense.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.unique_dim_consecutive.default,
}
_INDEX_OPS = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}
_FACTORIES = ("zeros", "ones", "full", "empty", "arange", "linspace", "eye", "rand", "randn", "randint")
_CTC_TENSOR_OPS = {aten.ctc_loss.Tensor, aten._ctc_loss.Tensor}


@dataclass(frozen=True)
class Event:
    """One host read of a device value: what it was and where (the innermost ppdist frame)."""

    kind: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.where}"


def _caller() -> str:
    """The innermost stack frame in ppdist (else the innermost outside torch), as file:line."""
    frames = [
        frame
        for frame in traceback.extract_stack()
        if frame.filename != __file__ and not frame.filename.endswith("_python_dispatch.py")
    ]
    for frame in reversed(frames):
        if "/ppdist/" in frame.filename:
            return f"{frame.filename.split('/ppdist/')[-1]}:{frame.lineno} ({frame.name})"
    for frame in reversed(frames):
        if "/torch/" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return "?"


def _names_device(device: Any) -> bool:
    """Whether a ``device`` argument places a tensor on the device: any device but the string
    "cpu" (code that says "cpu" means the host; a ``torch.device`` usually comes from ``x.device``)."""
    return device is not None and not (isinstance(device, str) and device.startswith("cpu"))


def _tensors(tree: Any) -> List[torch.Tensor]:
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]


class HostSyncCounter(TorchDispatchMode):
    """``with HostSyncCounter(host=[...]) as counter: step()`` then ``counter.events``.

    ``host``: tensors that live on the host by design (e.g. the batch entries a loss keeps there).
    """

    def __init__(self, host: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.events: List[Event] = []
        self._host: Dict[int, "weakref.ref[torch.Tensor]"] = {}
        self._patches: List[Tuple[Any, str, Any]] = []
        for tensor in host:
            self.mark_host(tensor)

    # ------------------------------------------------------------------ results
    @property
    def count(self) -> int:
        return len(self.events)

    def summary(self) -> Dict[str, int]:
        """Number of events per ``kind at where``."""
        counts: Dict[str, int] = {}
        for event in self.events:
            counts[str(event)] = counts.get(str(event), 0) + 1
        return counts

    def report(self) -> str:
        return "\n".join(f"{n} x {what}" for what, n in self.summary().items()) or "no host sync"

    # ------------------------------------------------------------------ bookkeeping
    def is_host(self, tensor: torch.Tensor) -> bool:
        ref = self._host.get(id(tensor))
        return ref is not None and ref() is tensor

    def mark_host(self, tensor: torch.Tensor) -> None:
        self._host[id(tensor)] = weakref.ref(tensor)

    def mark_device(self, tensor: torch.Tensor) -> None:
        self._host.pop(id(tensor), None)

    def _record(self, kind: str) -> None:
        self.events.append(Event(kind, _caller()))

    def _mark_host(self, tree: Any) -> None:
        for tensor in _tensors(tree):
            self.mark_host(tensor)

    # ------------------------------------------------------------------ the dispatch mode
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Optional[Dict] = None) -> Any:
        kwargs = kwargs or {}
        inputs = _tensors((args, kwargs))
        # a factory (no tensor input) is a device tensor unless its Python call had no device
        on_host = bool(inputs) and all(self.is_host(t) for t in inputs)
        if not on_host:
            self._check(func, args, kwargs)
        out = func(*args, **kwargs)
        if on_host or func is aten.scalar_tensor.default:  # a Python scalar made a tensor
            self._mark_host(out)
        return out

    def _check(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        if func in _ALWAYS_SYNC:
            self._record(func.name())
        elif func in _INDEX_OPS:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
                self._record(f"{func.name()} with a boolean mask")
        elif func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self._record("repeat_interleave without output_size")
        elif func in _CTC_TENSOR_OPS and not all(self.is_host(t) for t in args[2:4]):
            self._record("ctc_loss with lengths on the device")

    # ------------------------------------------------------------------ Python-level readers
    def __enter__(self) -> "HostSyncCounter":
        self._patch_readers()
        try:
            return super().__enter__()
        except BaseException:
            self._unpatch()
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._unpatch()

    def _patch(self, owner: Any, name: str, wrapper: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        self._patches.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def _unpatch(self) -> None:
        while self._patches:
            owner, name, original = self._patches.pop()
            setattr(owner, name, original)
        # torch._dynamo maps torch's functions to trace rules once per process; a map built while
        # the factories were wrapped would not know the restored ones (torch.compile would refuse
        # torch.arange afterwards)
        trace_rules = sys.modules.get("torch._dynamo.trace_rules")
        if trace_rules is not None:
            trace_rules.get_torch_obj_rule_map.cache_clear()

    def _patch_readers(self) -> None:
        counter = self

        def reader(kind: str) -> Callable[[Any], Any]:
            def wrap(original: Any) -> Any:
                def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                    if not counter.is_host(tensor):
                        counter._record(kind)
                    out = original(tensor, *args, **kwargs)
                    if isinstance(out, torch.Tensor):
                        if out is tensor:  # .cpu() of a CPU tensor is itself: an alias stands for the copy
                            out = out.view_as(out)
                        counter.mark_host(out)
                    return out

                return read

            return wrap

        for name in ("tolist", "numpy", "cpu", "__array__"):
            self._patch(torch.Tensor, name, reader(f"Tensor.{name}()"))

        def mover(original: Any) -> Any:
            def move(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                out = original(tensor, *args, **kwargs)
                targets_device = original is torch.Tensor.cuda or any(
                    isinstance(a, (torch.device, str)) and _names_device(a)
                    for a in (*args, kwargs.get("device"))
                )
                if counter.is_host(tensor) and targets_device:
                    if not kwargs.get("non_blocking", False):
                        counter._record("blocking host-to-device copy")
                    if out is not tensor:  # (on CPU the "copy" is the tensor itself)
                        counter.mark_device(out)
                return out

            return move

        self._patch(torch.Tensor, "to", mover)
        self._patch(torch.Tensor, "cuda", mover)

        def from_data(original: Any) -> Any:
            def make(data: Any, *args: Any, **kwargs: Any) -> Any:
                out = original(data, *args, **kwargs)
                to_device = _names_device(kwargs.get("device"))
                if isinstance(data, torch.Tensor):
                    if counter.is_host(data) and to_device and out is not data:
                        counter._record("blocking host-to-device copy")
                        counter.mark_device(out)
                elif to_device:
                    counter._record(f"torch.{original.__name__}(python data, device=...)")
                else:
                    counter.mark_host(out)
                return out

            return make

        def factory(original: Any) -> Any:
            def make(*args: Any, **kwargs: Any) -> Any:
                out = original(*args, **kwargs)
                if not _names_device(kwargs.get("device")):
                    counter.mark_host(out)
                return out

            return make

        self._patch(torch, "tensor", from_data)
        self._patch(torch, "as_tensor", from_data)
        for name in _FACTORIES:
            self._patch(torch, name, factory)


def count_host_syncs(run: Callable[[], Any], host: Iterable[torch.Tensor] = ()) -> HostSyncCounter:
    """Run ``run()`` under a ``HostSyncCounter`` and return the counter."""
    with HostSyncCounter(host) as counter:
        run()
    return counter
