"""MultiHead (PaddleOCR's ``rec_multi_head``): a CTC branch and a SAR branch on one feature map.

``head_list`` is PaddleOCR's list of one-key mappings::

    - CTCHead: {Neck: {name: svtr, dims: 64, ...}, Head: {fc_decay: 0.00001}}
    - SARHead: {enc_dim: 512, max_text_length: 25}

The CTC branch is a SequenceEncoder (``Neck.name`` is its ``encoder_type``) and a CTCHead; the SAR
branch is the ``SARHead`` of the HEADS registry. ``out_channels_list`` gives each branch its class
count (``CTCLabelDecode``: n, ``SARLabelDecode``: n + 2), as PaddleOCR's tools/train.py injects it.
Training returns ``{"ctc": logits, "ctc_neck": the CTC encoder's sequence, "sar": SAR logits}``
(the SAR head is teacher-forced with the batch); evaluation returns the CTC probabilities only.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn

from ppdist.errors import ConfigError
from ppdist.modeling.heads.ctc import CTCHead
from ppdist.modeling.necks.rnn import Im2Seq
from ppdist.registry import HEADS, NECKS

BRANCHES = ("CTCHead", "SARHead", "NRTRHead")
OUT_CHANNELS_KEYS = {"CTCHead": "CTCLabelDecode", "SARHead": "SARLabelDecode", "NRTRHead": "NRTRLabelDecode"}


def _branch(entry: Any, index: int) -> tuple:
    where = f"MultiHead.head_list[{index}]"
    if not isinstance(entry, Mapping) or len(entry) != 1:
        raise ValueError(f"{where} must be a one-key mapping such as {{CTCHead: {{...}}}}, got {entry!r}")
    name, args = next(iter(entry.items()))
    if name not in BRANCHES:
        raise ValueError(f"{where}: unknown head {name!r}; MultiHead takes CTCHead and SARHead")
    if name == "NRTRHead":
        raise ValueError(f"{where}: NRTRHead (PP-OCRv4's GTC branch) is not supported yet; use SARHead")
    if args is not None and not isinstance(args, Mapping):
        raise ValueError(f"{where}.{name} must be a mapping of its settings, got {args!r}")
    return name, dict(args or {}), f"{where}.{name}"


def _class_count(out_channels_list: Mapping[str, int], branch: str) -> int:
    key = OUT_CHANNELS_KEYS[branch]
    if key not in out_channels_list:
        raise ValueError(
            f"MultiHead.out_channels_list needs {key!r} for its {branch}, got {dict(out_channels_list)}"
        )
    return int(out_channels_list[key])


@HEADS.register(name="MultiHead")
class MultiHead(nn.Module):
    """CTC (SequenceEncoder + CTCHead) and SAR branches; see the module docstring."""

    def __init__(
        self, in_channels: int, out_channels_list: Dict[str, int], head_list: List[Dict[str, Any]]
    ) -> None:
        super().__init__()
        if not isinstance(head_list, (list, tuple)) or len(head_list) < 2:
            raise ValueError(f"MultiHead.head_list needs a CTCHead and a SARHead entry, got {head_list!r}")
        if not isinstance(out_channels_list, Mapping):
            raise ValueError(f"MultiHead.out_channels_list must be a mapping, got {out_channels_list!r}")
        self.sar_head: Optional[nn.Module] = None
        self.ctc_encoder: Optional[nn.Module] = None
        for index, entry in enumerate(head_list):
            name, args, where = _branch(entry, index)
            if name == "SARHead":
                self.sar_head = self._build_sar(
                    args, in_channels, _class_count(out_channels_list, name), where
                )
            else:
                self._build_ctc(args, in_channels, _class_count(out_channels_list, name), where)
        if self.ctc_encoder is None or self.sar_head is None:
            raise ValueError("MultiHead.head_list needs one CTCHead and one SARHead entry")
        self.out_channels = self.ctc_head.out_channels

    @staticmethod
    def _build_sar(args: Dict[str, Any], in_channels: int, classes: int, where: str) -> nn.Module:
        try:
            return HEADS.build(
                dict(args, name="SARHead"), where=where, in_channels=in_channels, out_channels=classes
            )
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    def _build_ctc(self, args: Dict[str, Any], in_channels: int, classes: int, where: str) -> None:
        unknown = [key for key in args if key not in ("Neck", "Head")]
        if unknown or not isinstance(args.get("Neck"), Mapping) or "name" not in args["Neck"]:
            raise ValueError(
                f"{where} needs Neck: {{name: svtr, ...}} and Head: {{...}} (got keys {sorted(args)})"
            )
        neck = dict(args["Neck"])
        neck = dict(neck, name="SequenceEncoder", encoder_type=neck["name"])  # Neck.name is the encoder type
        self.encoder_reshape = Im2Seq(in_channels)
        try:
            self.ctc_encoder = NECKS.build(neck, where=f"{where}.Neck", in_channels=in_channels)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        head = dict(args.get("Head") or {})
        try:
            self.ctc_head = CTCHead(self.ctc_encoder.out_channels, classes, **head)
        except TypeError as exc:
            raise ValueError(f"{where}.Head: {exc}") from None

    def forward(self, x: torch.Tensor, batch: Optional[Mapping[str, Any]] = None) -> Any:
        """Training: ``{"ctc", "ctc_neck", "sar"}``; evaluation: the CTC probabilities."""
        neck = self.ctc_encoder(x)
        ctc = self.ctc_head(neck)
        if not self.training:
            return ctc
        return {"ctc": ctc, "ctc_neck": neck, "sar": self.sar_head(x, batch)}
