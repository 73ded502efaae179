"""CSPPAN, the SLANet neck (PaddleOCR's ``ppocr.modeling.necks.csp_pan.CSPPAN``).

Every input level goes through a 1x1 ConvBN to ``out_channels`` (``conv_t``); a top-down path
(nearest upsample of the coarser map to the finer one's size, concat, CSPLayer) and a bottom-up
path (stride-2 depthwise-pointwise ``downsamples``, concat, CSPLayer) follow. Input: the backbone's
maps finest first; output: as many maps, finest first, each with ``out_channels`` channels.

Attribute names are PaddleOCR's (``conv_t.convs``, ``top_down_blocks``, ``downsamples``,
``bottom_up_blocks``, ``main_conv``, ``short_conv``, ``final_conv``, ``blocks``, ``dwconv``/``bn1``,
``pwconv``/``bn2``), so state-dict keys are Paddle's. Not PP-YOLOE's ``CustomCSPPAN``.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.registry import NECKS

ACTIVATIONS = ("leaky_relu", "hard_swish")
LEAKY_SLOPE = 0.01  # paddle.nn.functional.leaky_relu's default


def activation(act: str) -> nn.Module:
    """The module of a CSPPAN activation name (Paddle's ``leaky_relu`` or ``hard_swish``)."""
    if act == "leaky_relu":
        return nn.LeakyReLU(LEAKY_SLOPE)
    if act == "hard_swish":
        return nn.Hardswish()
    raise ValueError(f"CSPPAN.act must be one of {list(ACTIVATIONS)}, got {act!r}")


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)  # Paddle's BatchNorm2D (momentum 0.9)


class ConvBNLayer(nn.Module):
    """Bias-free conv ('same' padding) -> BatchNorm -> activation."""

    def __init__(
        self,
        in_channel: int,
        out_channel: int,
        kernel_size: int = 3,
        stride: int = 1,
        groups: int = 1,
        act: str = "leaky_relu",
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channel,
            out_channel,
            kernel_size,
            stride=stride,
            padding=(kernel_size - 1) // 2,
            groups=groups,
            bias=False,
        )
        self.bn = _bn(out_channel)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class DPModule(nn.Module):
    """Depthwise kxk conv -> BN -> act -> pointwise 1x1 conv -> BN -> act (``in_channel`` is
    grouped by ``out_channel``, as the original)."""

    def __init__(
        self,
        in_channel: int,
        out_channel: int,
        kernel_size: int = 3,
        stride: int = 1,
        act: str = "leaky_relu",
    ) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(
            in_channel,
            out_channel,
            kernel_size,
            stride=stride,
            padding=(kernel_size - 1) // 2,
            groups=out_channel,
            bias=False,
        )
        self.bn1 = _bn(out_channel)
        self.pwconv = nn.Conv2d(out_channel, out_channel, 1, bias=False)
        self.bn2 = _bn(out_channel)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn1(self.dwconv(x)))
        return self.act(self.bn2(self.pwconv(x)))


def conv_block(
    use_depthwise: bool, channels_in: int, channels_out: int, kernel: int, stride: int, act: str
) -> nn.Module:
    """A DPModule with ``use_depthwise``, else a ConvBNLayer."""
    if use_depthwise:
        return DPModule(channels_in, channels_out, kernel, stride=stride, act=act)
    return ConvBNLayer(channels_in, channels_out, kernel, stride=stride, act=act)


class DarknetBottleneck(nn.Module):
    """1x1 ConvBNLayer to ``out * expansion`` -> kxk conv block, plus the input when
    ``add_identity`` and the channels agree."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        expansion: float = 0.5,
        add_identity: bool = True,
        use_depthwise: bool = False,
        act: str = "leaky_relu",
    ) -> None:
        super().__init__()
        hidden = int(out_channels * expansion)
        self.conv1 = ConvBNLayer(in_channels, hidden, 1, act=act)
        self.conv2 = conv_block(use_depthwise, hidden, out_channels, kernel_size, 1, act)
        self.add_identity = add_identity and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.conv1(x))
        return out + x if self.add_identity else out


class CSPLayer(nn.Module):
    """Cross-stage partial layer: ``final_conv(concat(blocks(main_conv(x)), short_conv(x)))``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        expand_ratio: float = 0.5,
        num_blocks: int = 1,
        add_identity: bool = True,
        use_depthwise: bool = False,
        act: str = "leaky_relu",
    ) -> None:
        super().__init__()
        mid = int(out_channels * expand_ratio)
        self.main_conv = ConvBNLayer(in_channels, mid, 1, act=act)
        self.short_conv = ConvBNLayer(in_channels, mid, 1, act=act)
        self.final_conv = ConvBNLayer(2 * mid, out_channels, 1, act=act)
        self.blocks = nn.Sequential(
            *[
                DarknetBottleneck(mid, mid, kernel_size, 1.0, add_identity, use_depthwise, act=act)
                for _ in range(num_blocks)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.final_conv(torch.cat((self.blocks(self.main_conv(x)), self.short_conv(x)), dim=1))


class ChannelT(nn.Module):
    """One 1x1 ConvBNLayer per level, to ``out_channels`` (PaddleOCR's ``Channel_T``)."""

    def __init__(self, in_channels: Sequence[int], out_channels: int, act: str) -> None:
        super().__init__()
        self.convs = nn.ModuleList(ConvBNLayer(c, out_channels, 1, act=act) for c in in_channels)

    def forward(self, feats: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        return [conv(x) for conv, x in zip(self.convs, feats)]


def _check_arguments(
    in_channels: Union[int, Sequence[int]], out_channels: int, kernel_size: int, num_csp_blocks: int
) -> List[int]:
    if isinstance(in_channels, int) or not all(
        isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in in_channels
    ):
        raise ValueError(
            f"CSPPAN needs a backbone with several output levels (a list of channel counts), got {in_channels!r}"
        )
    for key, value in (
        ("out_channels", out_channels),
        ("kernel_size", kernel_size),
        ("num_csp_blocks", num_csp_blocks),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"CSPPAN.{key} must be a positive integer, got {value!r}")
    if kernel_size % 2 == 0:
        raise ValueError(f"CSPPAN.kernel_size must be odd ('same' padding), got {kernel_size}")
    return list(in_channels)


@NECKS.register(name="CSPPAN")
class CSPPAN(nn.Module):
    """Path aggregation with CSP layers: N maps (finest first) -> N maps of ``out_channels``."""

    def __init__(
        self,
        in_channels: Sequence[int],
        out_channels: int,
        kernel_size: int = 5,
        num_csp_blocks: int = 1,
        use_depthwise: bool = True,
        act: str = "hard_swish",
    ) -> None:
        super().__init__()
        self.in_channels = _check_arguments(in_channels, out_channels, kernel_size, num_csp_blocks)
        activation(act)  # the error names the key before any layer is built
        levels = len(self.in_channels)
        self.out_channels = [out_channels] * levels
        self.conv_t = ChannelT(self.in_channels, out_channels, act)

        def csp() -> CSPLayer:
            return CSPLayer(
                out_channels * 2,
                out_channels,
                kernel_size=kernel_size,
                num_blocks=num_csp_blocks,
                add_identity=False,
                use_depthwise=use_depthwise,
                act=act,
            )

        self.top_down_blocks = nn.ModuleList(csp() for _ in range(levels - 1))
        self.downsamples = nn.ModuleList(
            conv_block(use_depthwise, out_channels, out_channels, kernel_size, 2, act)
            for _ in range(levels - 1)
        )
        self.bottom_up_blocks = nn.ModuleList(csp() for _ in range(levels - 1))
        init_kaiming_uniform(self)

    def forward(self, inputs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        if len(inputs) != len(self.in_channels):
            raise ValueError(f"CSPPAN expects {len(self.in_channels)} feature maps, got {len(inputs)}")
        feats = self.conv_t(inputs)
        inner = [feats[-1]]  # top-down: coarsest first, each finer level prepended
        for block, low in zip(self.top_down_blocks, reversed(feats[:-1])):
            up = F.interpolate(inner[0], size=low.shape[2:], mode="nearest")
            inner.insert(0, block(torch.cat((up, low), dim=1)))
        outs = [inner[0]]  # bottom-up
        for down, block, high in zip(self.downsamples, self.bottom_up_blocks, inner[1:]):
            outs.append(block(torch.cat((down(outs[-1]), high), dim=1)))
        return tuple(outs)


def init_kaiming_uniform(module: nn.Module) -> None:
    """The original's init: conv weights KaimingUniform (U(+-sqrt(6 / fan_in))), BN weight 1, bias 0."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_uniform_(m.weight, a=0.0, mode="fan_in", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
