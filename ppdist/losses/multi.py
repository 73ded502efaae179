"""``MultiLoss`` (PaddleOCR's rec_multi_loss.py): the multi-head recogniser's CTC and SAR losses
on the ``ctc`` and ``sar`` branches of its training output."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn

from ppdist.errors import ConfigError
from ppdist.losses.ctc import CTCLoss
from ppdist.losses.entries import build_entry, parse_entries, set_sar_ignore_index
from ppdist.losses.precision import full_precision
from ppdist.losses.sar import SARLoss
from ppdist.registry import LOSSES

WHERE = "Loss.loss_config_list"
ATTRIBUTES = {"CTCLoss": "ctc", "SARLoss": "sar"}  # the supported parts and where they live


@LOSSES.register(name="MultiLoss")
class MultiLoss(nn.Module):
    """``loss_config_list``: ``[{CTCLoss: params}, {SARLoss: params}]`` (either may be left out).
    Returns ``CTCLoss`` (``weight_1`` x CTC of ``preds["ctc"]`` against ``batch["label_ctc"]``,
    ``batch["length"]`` kept on the host), ``SARLoss`` (``weight_2`` x SAR of ``preds["sar"]``
    against ``batch["label_sar"]``) and ``loss``, their sum.

    As PaddleOCR's tools/train.py, a ``SARLoss`` second in the list gets the SAR padding index
    (n + 1, from ``character_dict_path`` / ``use_space_char``, which Global injects) as its
    ``ignore_index``. NRTRLoss (PP-OCRv4) is not supported yet.
    """

    def __init__(
        self,
        loss_config_list: List[Dict[str, Any]],
        weight_1: float = 1.0,
        weight_2: float = 1.0,
        character_dict_path: Optional[str] = None,
        use_space_char: bool = False,
    ) -> None:
        super().__init__()
        parsed = parse_entries(loss_config_list, WHERE)
        set_sar_ignore_index(parsed, "SARLoss", 1, character_dict_path, use_space_char, WHERE)
        self.ctc: Optional[CTCLoss] = None
        self.sar: Optional[SARLoss] = None
        for i, (name, params) in enumerate(parsed):
            where = f"{WHERE}[{i}].{name}"
            if name not in ATTRIBUTES:
                raise ConfigError(
                    f"{where}: MultiLoss supports {', '.join(ATTRIBUTES)}"
                    + (" (NRTRLoss, PP-OCRv4's, is not supported yet)" if name == "NRTRLoss" else "")
                )
            if getattr(self, ATTRIBUTES[name]) is not None:
                raise ConfigError(f"{where}: {name} is listed twice")
            setattr(self, ATTRIBUTES[name], build_entry(name, params, where))
        self.weight_1 = float(weight_1)
        self.weight_2 = float(weight_2)
        self.order = [name for name, _ in parsed]
        self.host_keys = CTCLoss.host_keys if self.ctc is not None else ()

    @full_precision
    def forward(self, preds: Mapping[str, Any], batch: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        terms: Dict[str, torch.Tensor] = {}
        for name in self.order:
            if name == "CTCLoss":
                assert self.ctc is not None
                loss = self.ctc.score(preds["ctc"], batch["label_ctc"], batch["length"]) * self.weight_1
            else:
                assert self.sar is not None
                loss = self.sar.score(preds["sar"], batch["label_sar"]) * self.weight_2
            terms[name] = loss
        values = list(terms.values())
        total = values[0] if len(values) == 1 else values[0] + values[1]
        return dict(terms, loss=total)
