"""CTC head: per-frame class scores; softmax only in eval mode."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ppdist.modeling.layers import L2TaggedModule, at_least_fp32, init_linear_uniform
from ppdist.registry import HEADS


@HEADS.register(name="CTCHead")
class CTCHead(L2TaggedModule):
    """(B, T, in_channels) -> (B, T, out_channels): logits in training, probabilities in eval.

    ``mid_channels`` stacks two Linears (no activation in between). Every Linear parameter
    carries ``regularizer_factor = fc_decay`` (a per-parameter L2 coefficient).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        fc_decay: float = 0.0004,
        mid_channels: Optional[int] = None,
    ) -> None:
        super().__init__()
        if out_channels < 2:
            raise ValueError(f"CTCHead.out_channels must be >= 2 (blank + characters), got {out_channels}")
        self.out_channels = out_channels
        self.mid_channels = mid_channels
        if mid_channels is None:
            self.fc = nn.Linear(in_channels, out_channels)
            linears = [self.fc]
        else:
            if mid_channels < 1:
                raise ValueError(f"CTCHead.mid_channels must be positive, got {mid_channels}")
            self.fc1 = nn.Linear(in_channels, mid_channels)
            self.fc2 = nn.Linear(mid_channels, out_channels)
            linears = [self.fc1, self.fc2]
        for linear in linears:
            init_linear_uniform(linear)
        self.regularizer_factor = float(fc_decay)
        self.tag_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc(x) if self.mid_channels is None else self.fc2(self.fc1(x))
        if not self.training:
            x = torch.softmax(at_least_fp32(x), dim=2)  # fp32 probabilities also under autocast
        return x
