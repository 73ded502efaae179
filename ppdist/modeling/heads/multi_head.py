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

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import nn

from ppdist.errors import ConfigError
from ppdist.modeling.necks.rnn import Im2Seq
from ppdist.registry import HEADS, NECKS, Registry

OUT_CHANNELS_KEYS = {"CTCHead": "CTCLabelDecode", "SARHead": "SARLabelDecode", "NRTRHead": "NRTRLabelDecode"}


class Branch(NamedTuple):
    """One head_list entry as registry entries: the head (and the CTC branch's neck)."""

    name: str
    head: Dict[str, Any]  # {name: CTCHead | SARHead, **settings}
    neck: Optional[Dict[str, Any]]  # {name: SequenceEncoder, encoder_type, **settings} (CTC only)
    where: str


def parse_head_list(head_list: Any, where: str = "MultiHead") -> List[Branch]:
    """PaddleOCR's head_list as registry entries; ValueError naming the entry when one is wrong."""
    if not isinstance(head_list, (list, tuple)) or len(head_list) < 2:
        raise ValueError(f"{where}.head_list needs a CTCHead and a SARHead entry, got {head_list!r}")
    branches = []
    for index, entry in enumerate(head_list):
        here = f"{where}.head_list[{index}]"
        if not isinstance(entry, Mapping) or len(entry) != 1:
            raise ValueError(f"{here} must be a one-key mapping such as {{CTCHead: {{...}}}}, got {entry!r}")
        name, args = next(iter(entry.items()))
        if name == "NRTRHead":
            raise ValueError(f"{here}: NRTRHead (PP-OCRv4's GTC branch) is not supported yet; use SARHead")
        if name not in ("CTCHead", "SARHead"):
            raise ValueError(f"{here}: unknown head {name!r}; MultiHead takes CTCHead and SARHead")
        if args is not None and not isinstance(args, Mapping):
            raise ValueError(f"{here}.{name} must be a mapping of its settings, got {args!r}")
        args, here = dict(args or {}), f"{here}.{name}"
        if name == "SARHead":
            branches.append(Branch(name, dict(args, name=name), None, here))
            continue
        neck = args.get("Neck")
        if set(args) - {"Neck", "Head"} or not isinstance(neck, Mapping) or "name" not in neck:
            raise ValueError(
                f"{here} needs Neck: {{name: svtr, ...}} and Head: {{...}} (got keys {sorted(args)})"
            )
        neck = dict(neck, name="SequenceEncoder", encoder_type=neck["name"])  # Neck.name is the encoder type
        branches.append(Branch(name, dict(args.get("Head") or {}, name=name), neck, here))
    if sorted(branch.name for branch in branches) != ["CTCHead", "SARHead"]:
        raise ValueError(f"{where}.head_list needs one CTCHead and one SARHead entry")
    return branches


def _class_count(out_channels_list: Mapping[str, int], branch: str) -> int:
    key = OUT_CHANNELS_KEYS[branch]
    if key not in out_channels_list:
        raise ValueError(
            f"MultiHead.out_channels_list needs {key!r} for its {branch}, got {dict(out_channels_list)}"
        )
    return int(out_channels_list[key])


def _build(registry: Registry, entry: Dict[str, Any], where: str, **extra: Any) -> nn.Module:
    try:
        return registry.build(entry, where=where, **extra)
    except ConfigError as exc:  # MultiHead's own constructor error: the registry names Architecture.Head
        raise ValueError(str(exc)) from None


@HEADS.register(name="MultiHead")
class MultiHead(nn.Module):
    """CTC (SequenceEncoder + CTCHead) and SAR branches; see the module docstring."""

    def __init__(
        self, in_channels: int, out_channels_list: Dict[str, int], head_list: List[Dict[str, Any]]
    ) -> None:
        super().__init__()
        if not isinstance(out_channels_list, Mapping):
            raise ValueError(f"MultiHead.out_channels_list must be a mapping, got {out_channels_list!r}")
        for branch in parse_head_list(head_list):
            classes = _class_count(out_channels_list, branch.name)
            if branch.neck is not None:
                self.encoder_reshape = Im2Seq(in_channels)
                self.ctc_encoder = _build(NECKS, branch.neck, f"{branch.where}.Neck", in_channels=in_channels)
                self.ctc_head = _build(
                    HEADS,
                    branch.head,
                    f"{branch.where}.Head",
                    in_channels=self.ctc_encoder.out_channels,
                    out_channels=classes,
                )
            else:
                self.sar_head = _build(
                    HEADS, branch.head, branch.where, in_channels=in_channels, out_channels=classes
                )
        self.out_channels = self.ctc_head.out_channels

    @staticmethod
    def nested_entries(
        kwargs: Mapping[str, Any], where: str
    ) -> List[Tuple[Registry, Dict[str, Any], str, Tuple[str, ...]]]:
        """``(registry, entry, where, injected keys)`` of each branch, for config validation to check
        before anything is built (``ppdist.config.validate``)."""
        try:
            branches = parse_head_list(kwargs.get("head_list"), where)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        found = []
        for branch in branches:
            if branch.neck is not None:
                found.append((NECKS, branch.neck, f"{branch.where}.Neck", ("in_channels",)))
                found.append((HEADS, branch.head, f"{branch.where}.Head", ("in_channels", "out_channels")))
            else:
                found.append((HEADS, branch.head, branch.where, ("in_channels", "out_channels")))
        return found

    def forward(self, x: torch.Tensor, batch: Optional[Mapping[str, Any]] = None) -> Any:
        """Training: ``{"ctc", "ctc_neck", "sar"}``; evaluation: the CTC probabilities."""
        neck = self.ctc_encoder(x)
        ctc = self.ctc_head(neck)
        if not self.training:
            return ctc
        return {"ctc": ctc, "ctc_neck": neck, "sar": self.sar_head(x, batch)}
