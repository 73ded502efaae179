"""The whole training step captured once and replayed (``Global.cuda_graph``).

After ``warmup_steps`` eager steps (they create the optimizer's state, tune cuDNN and, with DDP,
build its buckets), the next step is captured — forward, loss, backward, clipping, non-finite
watch, optimizer, EMA — and every later step is a replay on the captured tensors: the batch is
copied into the captured batch's tensors, the global step into a device counter, and the LR
schedule, stepped on the host after each step, fills the learning rates' device tensors
(``WeightUpdate.capture_ready``). On CUDA the capture is a CUDA graph (one launch per step); on
the CPU its op-by-op equivalent (``ppdist.engine.graph_capture``), which checks the same
semantics. A batch whose shapes differ from the captured one is refused: the step is not static.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import nn

from ppdist.engine.dist import DistEnv
from ppdist.engine.graph_capture import CaptureError, capture_for
from ppdist.engine.update import WeightUpdate
from ppdist.errors import ConfigError
from ppdist.modeling.batch_norm import rescale_variances, variance_scales

StepBody = Callable[[Dict[str, Any]], Tuple[Dict[str, torch.Tensor], Any]]
DDP_WARMUP_STEPS = 11  # torch's rule for capturing DDP: at least 11 eager steps first
WARMUP_STEPS = 3


def warmup_steps_for(world_size: int) -> int:
    """Eager steps before the capture: torch's 11 with DDP, 3 otherwise."""
    return DDP_WARMUP_STEPS if world_size > 1 else WARMUP_STEPS


class StepGraph:
    """Runs ``body(batch) -> (loss terms, predictions)`` eagerly ``warmup_steps`` times, then
    captures it on ``device`` and replays it. ``step_number`` is the device counter the body
    reads as the global step being taken (``set_step`` fills it before each step).
    ``keep_state()``, called at the capture, returns what puts back, before each replay, the
    host-side state that the capture's Python decided on and others may change between steps
    (the BatchNorm variance scales that an evaluation or a checkpoint resets)."""

    def __init__(
        self,
        body: StepBody,
        device: torch.device,
        warmup_steps: int = WARMUP_STEPS,
        keep_state: Optional[Callable[[], Callable[[], None]]] = None,
    ) -> None:
        self.body = body
        self.keep_state = keep_state
        self.restore_state: Optional[Callable[[], None]] = None
        self.device = device
        self.capture = capture_for(device)
        self.eager_steps_left = int(warmup_steps)
        self.step_number = torch.zeros((), dtype=torch.int64, device=device)
        self.batch: Optional[Dict[str, Any]] = None  # the captured batch: the graph's inputs
        self.outputs: Optional[Tuple[Dict[str, torch.Tensor], Any]] = None

    @classmethod
    def for_training(
        cls,
        body: StepBody,
        model: nn.Module,
        update: WeightUpdate,
        env: DistEnv,
        accumulate_steps: int,
        autocast: Callable[[], Any],
    ) -> "StepGraph":
        """The captured step of a trainer: ``update`` in its captured form, the warm-up torch asks
        for with ``env``'s processes, the variance scales of ``model`` kept. One batch per step;
        ``autocast`` (the forward's) must keep no cache."""
        if accumulate_steps > 1:
            raise ConfigError(
                f"Global.cuda_graph captures a step of one batch: accumulate_steps {accumulate_steps} is "
                f"refused (raise the batch size instead, or set Global.cuda_graph: false)"
            )
        if getattr(autocast(), "_cache_enabled", False):
            raise ValueError(
                "a captured step needs autocast without its cache of cast weights (cache_enabled=False; "
                "make_autocast gives it with Global.cuda_graph)"
            )
        update.capture_ready(env.device)
        return cls(
            body,
            env.device,
            warmup_steps_for(env.world_size),
            keep_state=lambda: functools.partial(rescale_variances, variance_scales(model)),
        )

    @property
    def captured(self) -> bool:
        return self.outputs is not None

    def set_step(self, global_step: int) -> None:
        """The global step being taken (1-based), on the device without a host wait."""
        self.step_number.fill_(global_step)

    def run(self, batch: Dict[str, Any]) -> Tuple[Dict[str, torch.Tensor], Any]:
        """One training step on ``batch`` (on the device): eager, captured or replayed. The loss
        terms returned are this step's own tensors; the predictions are the captured ones (valid
        until the next step)."""
        if self.eager_steps_left > 0:
            self.eager_steps_left -= 1
            with self.capture.warmup():
                return self.body(batch)
        if self.outputs is None:
            self.batch = batch
            if self.keep_state is not None:
                self.restore_state = self.keep_state()
            try:
                self.outputs = self.capture.capture(lambda: self.body(batch))
            except (CaptureError, RuntimeError) as error:
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise ConfigError(
                    f"Global.cuda_graph: the training step could not be captured ({reason}); a step that "
                    f"reads a value on the host (a proposal NMS) or changes shapes cannot be; set "
                    f"Global.cuda_graph: false"
                ) from error
            if not self.capture.runs_while_capturing:
                self.capture.replay()
        else:
            self._load(batch)
            if self.restore_state is not None:
                self.restore_state()
            self.capture.replay()
        values, preds = self.outputs
        return _fresh(values), preds

    def _load(self, batch: Dict[str, Any]) -> None:
        """``batch``'s device tensors copied into the captured batch's, after checking that they
        are the same entries with the same shapes and dtypes."""
        assert self.batch is not None
        captured = {k: v for k, v in self.batch.items() if _on_device(v, self.device)}
        given = {k: v for k, v in batch.items() if _on_device(v, self.device)}
        for key in sorted(set(captured) | set(given)):
            before, now = captured.get(key), given.get(key)
            if before is None or now is None or before.shape != now.shape or before.dtype != now.dtype:
                raise ConfigError(
                    f"Global.cuda_graph: the training batch's {key!r} is {_describe(now)}, the captured "
                    f"step's {_describe(before)}: a recipe whose input shapes change (several training "
                    f"sizes, padding to each batch's largest image) cannot replay one captured step; "
                    f"set Global.cuda_graph: false"
                )
        for key, tensor in captured.items():
            tensor.copy_(given[key], non_blocking=True)


def _on_device(value: Any, device: torch.device) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == device.type


def _describe(tensor: Optional[torch.Tensor]) -> str:
    if tensor is None:
        return "absent"
    return (
        f"{'x'.join(str(n) for n in tensor.shape) or 'a scalar'} ({str(tensor.dtype).replace('torch.', '')})"
    )


def _fresh(values: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The loss terms in tensors of their own (the captured ones change at the next replay): one
    stacked copy."""
    if len({value.dtype for value in values.values()}) != 1:
        return {key: value.clone() for key, value in values.items()}
    stacked = torch.stack([value.reshape(()) for value in values.values()])
    return dict(zip(values, stacked.unbind()))
