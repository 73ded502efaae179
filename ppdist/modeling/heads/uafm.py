"""Unified Attention Fusion Modules (PP-LiteSeg's decoder blocks).

``UAFM(x_ch, y_ch, out_ch)`` fuses a low-level feature ``x`` with a high-level feature
``y``: ``x' = ConvBNReLU(x)`` (to ``y_ch``), ``y' = upsample(y)`` to ``x``'s size, an
attention map ``a`` from both, then ``ConvBNReLU(x' * a + y' * (1 - a))``.
"""

from __future__ import annotations

from typing import Dict, Type

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.layers import ConvBNAct


class UAFM(nn.Module):
    """The shared part: ``conv_x``, the bilinear upsampling of ``y`` and ``conv_out``."""

    def __init__(
        self, x_ch: int, y_ch: int, out_ch: int, ksize: int = 3, resize_mode: str = "bilinear"
    ) -> None:
        super().__init__()
        self.conv_x = ConvBNAct(x_ch, y_ch, ksize)
        self.conv_out = ConvBNAct(y_ch, out_ch, 3)
        self.resize_mode = resize_mode

    def upsample(self, y: torch.Tensor, size: torch.Size) -> torch.Tensor:
        if self.resize_mode in ("bilinear", "bicubic"):
            return F.interpolate(y, size, mode=self.resize_mode, align_corners=False)
        return F.interpolate(y, size, mode=self.resize_mode)

    def attention(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.conv_x(x)
        y = self.upsample(y, x.shape[2:])
        atten = self.attention(x, y)
        return self.conv_out(x * atten + y * self.complement(atten))

    def complement(self, atten: torch.Tensor) -> torch.Tensor:
        """``1 - a``, the weight of the upsampled high-level feature."""
        return 1.0 - atten


class UAFM_SpAtten(UAFM):
    """Spatial attention from ``[mean_c x, max_c x, mean_c y, max_c y]`` (4 -> 2 -> 1 convs)."""

    def __init__(
        self, x_ch: int, y_ch: int, out_ch: int, ksize: int = 3, resize_mode: str = "bilinear"
    ) -> None:
        super().__init__(x_ch, y_ch, out_ch, ksize, resize_mode)
        self.conv_xy_atten = nn.Sequential(ConvBNAct(4, 2, 3), ConvBNAct(2, 1, 3, act=None))
        # Paddle keeps the "1" of (1 - a) as a frozen parameter; here a buffer (same state key)
        self.register_buffer("_scale", torch.ones(1))

    def attention(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        stats = torch.cat(
            [
                x.mean(1, keepdim=True),
                x.amax(1, keepdim=True),
                y.mean(1, keepdim=True),
                y.amax(1, keepdim=True),
            ],
            dim=1,
        )
        return torch.sigmoid(self.conv_xy_atten(stats))

    def complement(self, atten: torch.Tensor) -> torch.Tensor:
        return self._scale - atten


class UAFM_ChAtten(UAFM):
    """Channel attention from ``[avg_hw x, avg_hw y, max_hw x, max_hw y]`` (4C -> C/2 -> C)."""

    def __init__(
        self, x_ch: int, y_ch: int, out_ch: int, ksize: int = 3, resize_mode: str = "bilinear"
    ) -> None:
        super().__init__(x_ch, y_ch, out_ch, ksize, resize_mode)
        self.conv_xy_atten = nn.Sequential(
            ConvBNAct(4 * y_ch, y_ch // 2, 1, act="leakyrelu"), ConvBNAct(y_ch // 2, y_ch, 1, act=None)
        )

    def attention(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        stats = torch.cat(
            [
                x.mean((2, 3), keepdim=True),
                y.mean((2, 3), keepdim=True),
                x.amax((2, 3), keepdim=True),
                y.amax((2, 3), keepdim=True),
            ],
            dim=1,
        )
        return torch.sigmoid(self.conv_xy_atten(stats))


FUSION_MODULES: Dict[str, Type[UAFM]] = {"UAFM_SpAtten": UAFM_SpAtten, "UAFM_ChAtten": UAFM_ChAtten}
