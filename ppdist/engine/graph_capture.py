"""Recording a training step once and replaying it: a CUDA graph on the GPU, its op-by-op
equivalent on the CPU.

A capture records the work of a zero-argument function; a replay runs the same work again on the
same tensors (the same memory), whatever the Python that produced it would do now: Python numbers
read during the capture stay what they were, a tensor filled in place between replays is read
with its new value. ``CudaGraphCapture`` is ``torch.cuda.CUDAGraph``. ``OpReplayCapture`` records
the ATen operations of the function (forward, the autograd engine's backward, optimizer kernels)
and replays them in order, each result written into the tensor the capture produced: the CUDA
graph's semantics on any device, so that the CPU tests check what a captured step computes (it
is not faster). Both refuse a host read during the capture, as a CUDA graph would fail on one.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

HOST_READS = (torch.ops.aten._local_scalar_dense.default,)  # .item(), bool(), float() of a tensor
SKIPPED_NAMESPACES = ("profiler",)  # record_function markers: no work to replay


class CaptureError(RuntimeError):
    """The function cannot be captured (it reads a value on the host, or changes shapes)."""


class CudaGraphCapture:
    """A ``torch.cuda.CUDAGraph`` of the function. Its warm-up steps run on a side stream (as
    CUDA graphs with DDP need); the capture records without running, so the caller replays once."""

    runs_while_capturing = False

    def __init__(self) -> None:
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.side_stream: Optional[torch.cuda.Stream] = None

    @contextlib.contextmanager
    def warmup(self):  # type: ignore[no-untyped-def]
        """Eager steps before the capture, on a side stream the current one waits for."""
        if self.side_stream is None:
            self.side_stream = torch.cuda.Stream()
        self.side_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side_stream):
            yield
        torch.cuda.current_stream().wait_stream(self.side_stream)

    def capture(self, function: Callable[[], Any]) -> Any:
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: a checkpoint written by the background thread meanwhile is not an error
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            return function()

    def replay(self) -> None:
        assert self.graph is not None, "replay before capture"
        self.graph.replay()


Call = Tuple[Any, tuple, dict, List[Optional[torch.Tensor]], List[bool], bool]


class _OpRecorder(TorchDispatchMode):
    """Runs and records every ATen call below autograd; a host read is refused."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Call] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in HOST_READS:
            raise CaptureError(
                "the training step reads a tensor's value on the host (.item(), bool(), float(), "
                "a data-dependent shape): a captured step cannot"
            )
        out = func(*args, **kwargs)
        if func.namespace not in SKIPPED_NAMESPACES:
            results, written = _results(func, out)
            self.calls.append((func, args, kwargs, results, written, torch.is_grad_enabled()))
        return out


def _results(func: Any, out: Any) -> Tuple[List[Optional[torch.Tensor]], List[bool]]:
    """The results of ``func`` by position (None where one is not a tensor) and, for each, whether
    it is a new tensor (not a view of, or the same tensor as, an input): what a replay writes its
    final value into."""
    values = list(out) if isinstance(out, (tuple, list)) else [out]
    returns = func._schema.returns
    specs = (
        [returns[0]] * len(values) if len(returns) == 1 and isinstance(out, (tuple, list)) else list(returns)
    )
    tensors = [value if isinstance(value, torch.Tensor) else None for value in values]
    written = [tensor is not None and spec.alias_info is None for tensor, spec in zip(tensors, specs)]
    return tensors, written


class OpReplayCapture:
    """The CUDA graph's semantics by recording ATen calls (see the module docstring); the capture
    runs the function.

    A replay runs the recorded calls again in order, each in the grad mode it was recorded in and
    below autograd, on the results of this replay's earlier calls (and on the tensors from outside
    the capture, read as they are now), then writes every new result into the tensor the capture
    made — as a CUDA graph leaves its results in the same memory. The grad mode matters: a kernel
    may choose its algorithm by it (oneDNN's LSTM keeps the workspace its backward needs only with
    grad enabled)."""

    runs_while_capturing = True

    def __init__(self) -> None:
        self.calls: List[Call] = []

    def warmup(self) -> ContextManager[None]:
        return contextlib.nullcontext()

    def capture(self, function: Callable[[], Any]) -> Any:
        recorder = _OpRecorder()
        with recorder:
            out = function()
        self.calls = recorder.calls
        return out

    def replay(self) -> None:
        fresh: Dict[int, torch.Tensor] = {}  # id of a captured result -> this replay's

        def now(value: Any) -> Any:
            return fresh.get(id(value), value) if isinstance(value, torch.Tensor) else value

        grad_mode = torch.is_grad_enabled()
        with torch._C._AutoDispatchBelowAutograd():  # no autograd graph, each call in its grad mode
            try:
                for call in self.calls:
                    self._run(call, now, fresh)
            finally:
                torch.set_grad_enabled(grad_mode)
        self._publish(fresh)

    @staticmethod
    def _run(call: Call, now: Callable[[Any], Any], fresh: Dict[int, torch.Tensor]) -> None:
        """One recorded call on this replay's tensors, in the grad mode it was made in."""
        func, args, kwargs, results, _, grad_enabled = call
        torch.set_grad_enabled(grad_enabled)
        out = func(*tree_map(now, args), **tree_map(now, kwargs))
        if func.namespace == "c10d":  # a collective: done before the next call, as a stream orders it
            _wait_for_work(out)
        for captured, new in zip(results, _results(func, out)[0]):
            if captured is not None and new is not None:
                fresh[id(captured)] = new

    @torch.no_grad()
    def _publish(self, fresh: Dict[int, torch.Tensor]) -> None:
        """Every new result's final value written into the tensor the capture made."""
        for func, _, _, results, written, _ in self.calls:
            for captured, is_new in zip(results, written):
                if not is_new:
                    continue
                new = fresh.get(id(captured))
                if new is None:
                    raise CaptureError(f"{func} gave no tensor where the capture's gave one")
                if captured.shape != new.shape:
                    raise CaptureError(
                        f"{func} gave a {tuple(new.shape)} result, captured {tuple(captured.shape)}"
                    )
                if new is not captured:
                    captured.copy_(new)


def _wait_for_work(result: Any) -> None:
    """Wait for the collectives' ``Work`` objects in ``result``."""
    for item in result if isinstance(result, (tuple, list)) else (result,):
        if hasattr(item, "wait") and not isinstance(item, torch.Tensor):
            item.wait()


def capture_for(device: torch.device) -> Any:
    """The capture of a step on ``device``: a CUDA graph, or its op-by-op replay elsewhere."""
    return CudaGraphCapture() if device.type == "cuda" else OpReplayCapture()


def flat_tensors(tree: Any) -> List[torch.Tensor]:
    """The tensors of a nested structure (dicts, lists, tuples), in order."""
    leaves, _ = tree_flatten(tree)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
