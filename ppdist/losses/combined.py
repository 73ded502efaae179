"""``CombinedLoss`` (PaddleOCR's combined_loss.py): a weighted sum of losses built from
``loss_config_list``, every term of every part reported (weighted), ``loss`` their total."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn

from ppdist.errors import ConfigError
from ppdist.losses.distillation import sum_tensors
from ppdist.losses.entries import build_entry, parse_entries, set_sar_ignore_index
from ppdist.losses.precision import full_precision
from ppdist.registry import LOSSES

WHERE = "Loss.loss_config_list"


@LOSSES.register(name="CombinedLoss")
class CombinedLoss(nn.Module):
    """``loss_config_list``: ``[{LossName: {weight: w, ...its params}}, ...]``; every entry needs
    ``weight``. Each part is called with ``(preds, batch)``; its terms are multiplied by its weight
    and reported under their own names; the total adds each part's weighted ``loss`` (or the sum
    of its terms when it has none). A part returning a bare tensor is named ``loss_{LossName}_{i}``.

    As PaddleOCR's tools/train.py, a ``DistillationSARLoss`` that is the last entry gets the SAR
    padding index (n + 1, from ``character_dict_path`` / ``use_space_char``, which Global injects)
    as its ``ignore_index``; ``Global.cuda_graph`` goes to the parts that take it (CTC's lengths on
    the device). ``host_keys``: the union of the parts'.
    """

    required_entry_keys = ("weight",)  # consumed here, not passed to the part (config validation strips them)

    def __init__(
        self,
        loss_config_list: List[Dict[str, Any]],
        character_dict_path: Optional[str] = None,
        use_space_char: bool = False,
        cuda_graph: bool = False,
    ) -> None:
        super().__init__()
        parsed = parse_entries(loss_config_list, WHERE)
        set_sar_ignore_index(parsed, "DistillationSARLoss", -1, character_dict_path, use_space_char, WHERE)
        parts, weights, names = [], [], []
        for i, (name, params) in enumerate(parsed):
            where = f"{WHERE}[{i}].{name}"
            weight = params.pop("weight", None)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ConfigError(f"{where}.weight is required: a number, got {weight!r}")
            if cuda_graph and "cuda_graph" in LOSSES.accepted_keys(name)[0]:  # Global's, for the parts
                params = dict(params, cuda_graph=True)
            parts.append(build_entry(name, params, where))
            weights.append(float(weight))
            names.append(name)
        self.parts = nn.ModuleList(parts)
        self.weights = weights
        self.names = names
        self.host_keys = tuple(dict.fromkeys(k for part in parts for k in getattr(part, "host_keys", ())))

    @full_precision
    def forward(self, preds: Any, batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        terms: Dict[str, torch.Tensor] = {}
        total: Optional[torch.Tensor] = None
        for idx, (part, weight, name) in enumerate(zip(self.parts, self.weights, self.names)):
            out = part(preds, batch)
            if isinstance(out, torch.Tensor):
                out = {f"loss_{name}_{idx}": out}
            out = {key: value * weight for key, value in out.items()}
            share = out["loss"] if "loss" in out else sum_tensors(list(out.values()))
            total = share if total is None else total + share
            terms.update((k, v) for k, v in out.items() if k != "loss")
        assert total is not None  # parse_entries refuses an empty list
        return dict({"loss": total}, **terms)
