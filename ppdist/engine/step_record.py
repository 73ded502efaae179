"""What one training step did, as the trainer hands it to its hooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class StepRecord:
    """What one step did, for the hooks: loss terms (detached tensors, read only when logged),
    samples of all processes and of this one, the wait for data and the whole step (seconds),
    and the bad samples that were replaced in this process's batch. With a training metric,
    also the step's (detached) predictions and batch, for the log steps that compute it."""

    values: Dict[str, Any]
    samples: int
    local_samples: int
    reader_cost: float
    batch_cost: float
    bad_samples: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    preds: Any = None
    batch: Optional[Dict[str, Any]] = None
