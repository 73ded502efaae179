"""Where a training run stands, and the arithmetic that moves it.

A run is a sequence of epochs; each epoch is one seeded permutation of the training set that all
processes consume together, ``samples_per_step`` samples per optimizer step. The position is
therefore a single number within the epoch — the samples already used — which any layout (other
world size or batch size) can continue from without repeating or skipping a sample. The batch
index and the global step follow from it under the current layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Protocol, Tuple


class EpochSampler(Protocol):
    """What the position needs of the training batch sampler (``ppdist.data.samplers.TrainBatchSampler``)."""

    dataset_len: int
    batch_size: int
    world_size: int
    samples_per_step: int
    accumulate_steps: int
    steps_per_epoch: int

    def set_epoch(self, epoch: int) -> None: ...

    def set_position(self, consumed: int) -> None: ...

    def remaining_batches(self) -> int: ...


def run_length(epoch_num: Optional[int], max_iters: Optional[int], steps_per_epoch: int) -> Tuple[int, int]:
    """``(epochs, total_steps)`` of a schedule given in epochs or, when ``max_iters`` is set, in steps."""
    if max_iters:
        return math.ceil(int(max_iters) / steps_per_epoch), int(max_iters)
    return int(epoch_num or 0), int(epoch_num or 0) * steps_per_epoch


@dataclass(frozen=True)
class Layout:
    """How an epoch is cut into steps: data set size, batch per process, processes, steps per
    epoch, and micro-batches accumulated per optimizer step."""

    dataset_len: int
    batch_size: int
    world_size: int
    steps_per_epoch: int
    accumulate_steps: int = 1

    @property
    def samples_per_step(self) -> int:
        """The global batch of one optimizer step."""
        return self.batch_size * self.world_size * self.accumulate_steps

    @classmethod
    def of(cls, sampler: EpochSampler) -> "Layout":
        return cls(
            sampler.dataset_len,
            sampler.batch_size,
            sampler.world_size,
            sampler.steps_per_epoch,
            sampler.accumulate_steps,
        )


class RunPosition:
    """Epoch ``next_epoch`` (1-based) continues after its first ``epoch_consumed`` samples (all
    processes together), i.e. with batch ``next_batch`` of this layout; ``global_step`` optimizer
    steps are done. ``iteration_based`` runs (``max_iters``) keep their step count across layouts;
    epoch-based ones count ``steps_per_epoch`` per finished epoch."""

    def __init__(self, layout: Layout, iteration_based: bool = False) -> None:
        self.layout = layout
        self.iteration_based = iteration_based
        self.next_epoch, self.next_batch, self.epoch_consumed, self.global_step = 1, 0, 0, 0

    # ------------------------------------------------------------------ moving
    def enter_epoch(self, sampler: EpochSampler) -> None:
        """Point ``sampler`` at the next unseen batch of ``next_epoch``."""
        sampler.set_epoch(self.next_epoch)
        sampler.set_position(self.epoch_consumed)

    def advance(self) -> bool:
        """Count one optimizer step; the epoch is finished at once when that was its last batch.
        Returns whether it was."""
        self.global_step += 1
        self.next_batch += 1
        self.epoch_consumed += self.layout.samples_per_step
        if self.next_batch >= self.layout.steps_per_epoch:
            self.finish_epoch()
            return True
        return False

    def finish_epoch(self) -> None:
        self.next_epoch, self.next_batch, self.epoch_consumed = self.next_epoch + 1, 0, 0

    @property
    def completed_epoch(self) -> int:
        """The last epoch with at least one step done (``next_epoch - 1`` at an epoch boundary)."""
        return self.next_epoch if self.next_batch else self.next_epoch - 1

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> Dict[str, int]:
        return {
            "next_epoch": self.next_epoch,
            "next_batch": self.next_batch,
            "epoch_consumed": self.epoch_consumed,
            "global_step": self.global_step,
            "dataset_len": self.layout.dataset_len,
            "batch_size_per_card": self.layout.batch_size,
            "world_size": self.layout.world_size,
            "steps_per_epoch": self.layout.steps_per_epoch,
            "accumulate_steps": self.layout.accumulate_steps,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The saved numbers as they are (same layout); see ``relayout`` for another one."""
        self.next_epoch, self.next_batch = int(state["next_epoch"]), int(state["next_batch"])
        consumed = state.get("epoch_consumed")
        self.epoch_consumed = int(
            consumed if consumed is not None else self.next_batch * self.layout.samples_per_step
        )
        self.global_step = int(state["global_step"])

    def saved_layout(self, state: Mapping[str, Any]) -> Layout:
        """The layout a checkpoint's position was written with (older files lack the batch size
        and the accumulation, which was 1)."""
        return Layout(
            int(state.get("dataset_len") or self.layout.dataset_len),
            int(state.get("batch_size_per_card") or self.layout.batch_size),
            int(state["world_size"]),
            int(state["steps_per_epoch"]),
            int(state.get("accumulate_steps") or 1),
        )

    def relayout(self, sampler: EpochSampler) -> int:
        """After ``load_state_dict`` of a position written with another layout: continue the same
        epoch from the same sample under this one. Epoch-based runs restart the step count of the
        epoch so that it ends exactly at ``epoch * steps_per_epoch``; iteration-based runs keep
        theirs. Returns the batches left in the epoch."""
        self.enter_epoch(sampler)
        left = sampler.remaining_batches()
        self.next_batch = self.layout.steps_per_epoch - left
        if not self.iteration_based:
            self.global_step = (self.next_epoch - 1) * self.layout.steps_per_epoch + self.next_batch
        return left
