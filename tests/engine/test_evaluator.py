"""The evaluator leaves on the host the batch entries its post-process names in ``host_keys``."""

from typing import Any, Dict, List

import torch
from torch import nn

from ppdist.engine.dist import DistEnv
from ppdist.engine.evaluator import Evaluator
from ppdist.metrics.base import Metric


class Passthrough(nn.Module):
    def forward(self, batch):
        return batch["image"]


class DevicesSeen(Metric):
    """Records the device of every tensor of each batch the post-process saw."""

    main_indicator = "batches"

    def reset(self) -> None:
        self.seen: List[Dict[str, str]] = []

    def update(self, results: Any, batch: Dict[str, Any]) -> None:
        self.seen.append(results)

    def state(self) -> Dict[str, Any]:
        return {"seen": list(self.seen)}

    def load_states(self, states: List[Dict[str, Any]]) -> None:
        self.seen = [entry for state in states for entry in state["seen"]]

    def compute(self) -> Dict[str, float]:
        return {"batches": float(len(self.seen))}


class HostKeysPostProcess:
    host_keys = ("im_id", "scale_factor")

    def __call__(self, preds: torch.Tensor, batch: Dict[str, Any]) -> Dict[str, str]:
        seen = {key: value.device.type for key, value in batch.items() if isinstance(value, torch.Tensor)}
        return dict(seen, preds=preds.device.type)


def test_the_post_process_host_keys_stay_on_the_host():
    batch = {
        "image": torch.zeros(2, 3, 8, 8),
        "im_id": torch.tensor([[4], [5]]),
        "scale_factor": torch.ones(2, 2),
        "gt_bbox": torch.zeros(2, 1, 4),
    }
    metric = DevicesSeen()
    # the "meta" device stands for an accelerator: what moves there is visible
    evaluator = Evaluator([batch], HostKeysPostProcess(), metric, DistEnv(device=torch.device("meta")))
    assert evaluator.run(Passthrough()) == {"batches": 1.0}
    assert metric.seen == [
        {"image": "meta", "gt_bbox": "meta", "im_id": "cpu", "scale_factor": "cpu", "preds": "meta"}
    ]
