"""HRNet, OCRNet's backbone (PaddleSeg semantics): parallel multi-resolution branches, fused.

A stem of two stride-2 3x3 convs (1/4), ``la1`` (bottleneck blocks), then three stages, each
opened by a transition (a new branch at half the resolution of the last) and made of modules
that run every branch's BasicBlocks and fuse the branches: each output branch sums every input
branch, the lower resolutions through a 1x1 ConvBN and a bilinear upsampling, the higher ones
through a chain of stride-2 3x3 convs (the paths down from one branch share its padded copy). The output is one map at 1/4: the four branches of the last
stage, upsampled and concatenated (``out_channels == [sum(stage 4 widths)]``).

Paddle's ``padding='same'`` (PaddleSeg's default, ``padding_same``) pads a stride-2 3x3 conv by
0 before and 1 after an even size, 1 and 1 around an odd one (``SameStride2Conv``).

Module names are PaddleSeg's (``la1.bb_layer2_1``, ``st3.stage_st3_2.fuse_func.residual_st3_2_layer_3_1_2``)
so that a Paddle key is ppdist's with ``_conv`` / ``_batch_norm`` for ``conv`` / ``bn``.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.freezing import FreezableBackbone
from ppdist.modeling.paddle_names import PaddleNames
from ppdist.registry import BACKBONES

CONV_BN_RENAMES = (
    (r"^(.+)\.conv\.(weight|bias)$", r"\1._conv.\2"),  # ConvNorm.conv -> PaddleSeg's ConvBN(ReLU)._conv
    (r"^(.+)\.bn\.(\w+)$", r"\1._batch_norm.\2"),  # ConvNorm.bn -> ._batch_norm
)


def same_pad(x: torch.Tensor) -> torch.Tensor:
    """``x`` padded for a 3x3 stride-2 conv with Paddle's ``padding='same'``: ``n % 2`` before, 1
    after (torch's convolutions pad symmetrically: an even size needs this copy)."""
    height, width = x.shape[-2:]  # traced as sizes: exported graphs pad by each input's parity
    return F.pad(x, (width % 2, 1, height % 2, 1))


class SameStride2Conv(nn.Conv2d):
    """Bias-free 3x3 stride-2 conv with Paddle's ``padding='same'``: output ``ceil(n / 2)``, padding
    ``n % 2`` before and 1 after (the windows end on the last row / column). ``forward_padded``
    takes an input already ``same_pad``-ed (one copy shared by the convs reading the same map)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, 3, stride=2, padding=0, bias=False)

    def forward_padded(self, padded: torch.Tensor) -> torch.Tensor:
        return F.conv2d(padded, self.weight, None, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_padded(same_pad(x))


class ConvNorm(nn.Module):
    """Bias-free conv -> BatchNorm -> optional ReLU (PaddleSeg's ``ConvBN`` / ``ConvBNReLU`` in HRNet)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        relu: bool = True,
        padding_same: bool = True,
    ) -> None:
        super().__init__()
        if stride == 2 and padding_same:
            self.conv: nn.Conv2d = SameStride2Conv(in_channels, out_channels)
        else:
            self.conv = nn.Conv2d(
                in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2, bias=False
            )
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
        self.relu = relu

    def pads_same(self) -> bool:
        """Whether the conv is a ``SameStride2Conv`` (which ``forward(..., padded=True)`` feeds)."""
        return isinstance(self.conv, SameStride2Conv)

    def forward(self, x: torch.Tensor, padded: bool = False) -> torch.Tensor:
        """``padded``: ``x`` is already ``same_pad``-ed (a ``SameStride2Conv`` only)."""
        x = self.bn(self.conv.forward_padded(x) if padded else self.conv(x))
        return F.relu(x) if self.relu else x


class SELayer(nn.Module):
    """Squeeze-and-excitation: global mean, Linear C -> C/16, ReLU, Linear -> C, sigmoid gate."""

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        squeezed = int(channels / reduction)
        self.squeeze = nn.Linear(channels, squeezed)
        self.excitation = nn.Linear(squeezed, channels)
        for linear in (self.squeeze, self.excitation):  # Paddle: weights U(+-1/sqrt(in)), biases 0
            bound = 1.0 / math.sqrt(linear.in_features)
            nn.init.uniform_(linear.weight, -bound, bound)
            nn.init.zeros_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.excitation(F.relu(self.squeeze(x.mean(dim=(2, 3))))))
        return x * gate[:, :, None, None]


class BottleneckBlock(nn.Module):
    """1x1 -> 3x3 -> 1x1 (x4 width) [-> SE] + shortcut (1x1 ConvBN when ``downsample``), ReLU."""

    def __init__(self, in_channels: int, filters: int, has_se: bool, downsample: bool) -> None:
        super().__init__()
        self.conv1 = ConvNorm(in_channels, filters, 1)
        self.conv2 = ConvNorm(filters, filters, 3)
        self.conv3 = ConvNorm(filters, filters * 4, 1, relu=False)
        self.conv_down = ConvNorm(in_channels, filters * 4, 1, relu=False) if downsample else None
        self.se = SELayer(filters * 4) if has_se else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv3(self.conv2(self.conv1(x)))
        if self.se is not None:
            y = self.se(y)
        return F.relu(y + (self.conv_down(x) if self.conv_down is not None else x))


class BasicBlock(nn.Module):
    """3x3 ConvBNReLU -> 3x3 ConvBN [-> SE] + identity, ReLU."""

    def __init__(self, in_channels: int, filters: int, has_se: bool) -> None:
        super().__init__()
        self.conv1 = ConvNorm(in_channels, filters, 3)
        self.conv2 = ConvNorm(filters, filters, 3, relu=False)
        self.se = SELayer(filters) if has_se else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        if self.se is not None:
            y = self.se(y)
        return F.relu(y + x)


class Named(nn.Module):
    """A container whose children carry PaddleSeg's generated names, run in the order added."""

    def __init__(self) -> None:
        super().__init__()
        self._order: List[str] = []

    def add(self, name: str, module: nn.Module) -> None:
        self.add_module(name, module)
        self._order.append(name)

    def children_in_order(self) -> List[nn.Module]:
        return [getattr(self, name) for name in self._order]


class Layer1(Named):
    """``la1``: bottleneck blocks ``bb_layer2_<i>`` (the first one with a 1x1 shortcut)."""

    def __init__(self, in_channels: int, filters: int, blocks: int, has_se: bool) -> None:
        super().__init__()
        for i in range(blocks):
            self.add(
                f"bb_layer2_{i + 1}",
                BottleneckBlock(in_channels if i == 0 else filters * 4, filters, has_se, downsample=i == 0),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.children_in_order():
            x = block(x)
        return x


class TransitionLayer(nn.Module):
    """Branch i: a 3x3 ConvBNReLU where the width changes (identity otherwise); each new branch a
    stride-2 3x3 ConvBNReLU of the last input branch."""

    def __init__(
        self, in_channels: Sequence[int], out_channels: Sequence[int], name: str, padding_same: bool
    ):
        super().__init__()
        self._convs: List[str] = []
        for i, width in enumerate(out_channels):
            key = f"transition_{name}_layer_{i + 1}"
            if i < len(in_channels):
                if in_channels[i] == width:
                    key = ""
                else:
                    self.add_module(key, ConvNorm(in_channels[i], width, 3, padding_same=padding_same))
            else:
                self.add_module(key, ConvNorm(in_channels[-1], width, 3, 2, padding_same=padding_same))
            self._convs.append(key)

    def forward(self, x: List[torch.Tensor]) -> List[torch.Tensor]:
        outs = []
        for i, key in enumerate(self._convs):
            source = x[i] if i < len(x) else x[-1]
            outs.append(getattr(self, key)(source) if key else source)
        return outs


class FuseLayers(nn.Module):
    """Output branch i = ReLU(x_i + sum over j > i of upsample(ConvBN_1x1(x_j)) + sum over j < i of
    (i - j) stride-2 3x3 convs of x_j (ConvBNReLU at x_j's width, the last a ConvBN to x_i's))."""

    def __init__(self, channels: Sequence[int], name: str, align_corners: bool, padding_same: bool) -> None:
        super().__init__()
        self.align_corners = align_corners
        self.branches = len(channels)
        self._paths: Dict[Tuple[int, int], List[str]] = {}
        for i in range(self.branches):
            for j in range(self.branches):
                if j > i:
                    key = f"residual_{name}_layer_{i + 1}_{j + 1}"
                    self.add_module(key, ConvNorm(channels[j], channels[i], 1, relu=False))
                    self._paths[(i, j)] = [key]
                elif j < i:
                    keys = []
                    for k in range(i - j):
                        last = k == i - j - 1
                        key = f"residual_{name}_layer_{i + 1}_{j + 1}_{k + 1}"
                        self.add_module(
                            key,
                            ConvNorm(
                                channels[j],
                                channels[i] if last else channels[j],
                                3,
                                2,
                                relu=not last,
                                padding_same=padding_same,
                            ),
                        )
                        keys.append(key)
                    self._paths[(i, j)] = keys

    def forward(self, x: List[torch.Tensor]) -> List[torch.Tensor]:
        outs = []
        padded: Dict[int, torch.Tensor] = {}  # branch j same-padded once for every path down from it
        for i in range(self.branches):
            out = x[i]
            for j in range(self.branches):
                if j == i:
                    continue
                y = x[j]
                for k, key in enumerate(self._paths[(i, j)]):
                    layer = getattr(self, key)
                    if k == 0 and j < i and layer.pads_same():
                        if j not in padded:
                            padded[j] = same_pad(y)
                        y = layer(padded[j], padded=True)
                    else:
                        y = layer(y)
                if j > i:
                    y = F.interpolate(y, x[i].shape[-2:], mode="bilinear", align_corners=self.align_corners)
                out = out + y
            outs.append(F.relu(out))
        return outs


class HighResolutionModule(nn.Module):
    """Every branch's BasicBlocks (``branches_func``), then the fuse (``fuse_func``)."""

    def __init__(
        self,
        channels: Sequence[int],
        blocks: Sequence[int],
        has_se: bool,
        name: str,
        align_corners: bool,
        padding_same: bool,
    ) -> None:
        super().__init__()
        self.branches_func = Named()
        self._branch_keys: List[List[str]] = []
        for i, width in enumerate(channels):
            keys = []
            for j in range(blocks[i]):
                key = f"bb_{name}_branch_layer_{i + 1}_{j + 1}"
                self.branches_func.add(key, BasicBlock(width, width, has_se))
                keys.append(key)
            self._branch_keys.append(keys)
        self.fuse_func = FuseLayers(channels, name, align_corners, padding_same)

    def forward(self, x: List[torch.Tensor]) -> List[torch.Tensor]:
        outs = []
        for feat, keys in zip(x, self._branch_keys):
            for key in keys:
                feat = getattr(self.branches_func, key)(feat)
            outs.append(feat)
        return self.fuse_func(outs)


class Stage(Named):
    """``modules`` HighResolutionModules named ``stage_<name>_<i>``."""

    def __init__(
        self,
        channels: Sequence[int],
        modules: int,
        blocks: Sequence[int],
        has_se: bool,
        name: str,
        align_corners: bool,
        padding_same: bool,
    ) -> None:
        super().__init__()
        for i in range(modules):
            self.add(
                f"stage_{name}_{i + 1}",
                HighResolutionModule(
                    channels, blocks, has_se, f"{name}_{i + 1}", align_corners, padding_same
                ),
            )

    def forward(self, x: List[torch.Tensor]) -> List[torch.Tensor]:
        for module in self.children_in_order():
            x = module(x)
        return x


# stage 1 (la1): (bottleneck blocks, width); stages 2-4: (modules, blocks per branch, widths)
Stage1Spec = Tuple[int, int]
StageSpec = Tuple[int, Tuple[int, ...], Tuple[int, ...]]
HRNetSpec = Tuple[Stage1Spec, StageSpec, StageSpec, StageSpec]


def _wide(width: int) -> HRNetSpec:
    """PaddleSeg's HRNet_W<width>: la1 of 4 bottlenecks at 64; stages of 1, 4 and 3 modules of 4 blocks."""
    widths = (width, 2 * width, 4 * width, 8 * width)
    return (4, 64), (1, (4, 4), widths[:2]), (4, (4, 4, 4), widths[:3]), (3, (4, 4, 4, 4), widths)


class HRNet(FreezableBackbone):
    """PaddleSeg's HRNet; returns ``[the 1/4 map of the concatenated branches]``. The registered
    factories (``HRNet_W18``...) set ``SPEC``, the stage layout of PaddleSeg's factory of that name.
    Units for ``freeze_at`` / ``frozen_stages`` / ``freeze_norm`` (``ppdist.modeling.freezing``; not
    PaddleSeg settings): the stem (``conv_layer1_1``, ``conv_layer1_2``), then 4 stages: ``la1``,
    and each of stages 2-4 with the transition that opens it (``tr1`` + ``st2``...)."""

    # PaddleSeg's ConvBN / ConvBNReLU name their layers ``_conv`` / ``_batch_norm``; every other name
    # is PaddleSeg's. ImageNet files (``hrnet_w18_ssld``) hold the same keys without ``backbone.``.
    paddle_names = PaddleNames(renames=CONV_BN_RENAMES)

    SPEC: HRNetSpec  # set by each registered factory

    def __init__(
        self,
        in_channels: int = 3,
        has_se: bool = False,
        align_corners: bool = False,
        padding_same: bool = True,
        freeze_at: Optional[int] = None,
        frozen_stages: Optional[int] = None,
        freeze_norm: bool = False,
    ) -> None:
        super().__init__()
        self.align_corners = align_corners
        self.conv_layer1_1 = ConvNorm(in_channels, 64, 3, 2, padding_same=padding_same)
        self.conv_layer1_2 = ConvNorm(64, 64, 3, 2, padding_same=padding_same)
        (blocks1, width1), *stages = self.SPEC
        self.la1 = Layer1(64, width1, blocks1, has_se)
        previous = [width1 * 4]
        for index, (modules, blocks, widths) in enumerate(stages, start=1):
            self.add_module(f"tr{index}", TransitionLayer(previous, widths, f"tr{index}", padding_same))
            name = f"st{index + 1}"
            self.add_module(name, Stage(widths, modules, blocks, has_se, name, align_corners, padding_same))
            previous = list(widths)
        self.out_channels = [sum(previous)]
        self._init_weights()
        units = [[self.conv_layer1_1, self.conv_layer1_2], [self.la1]]
        units += [[getattr(self, f"tr{i}"), getattr(self, f"st{i + 1}")] for i in (1, 2, 3)]
        self.freeze(units, freeze_at, frozen_stages, freeze_norm)

    def _init_weights(self) -> None:
        """PaddleSeg's HRNet init: convs Normal(0, 0.001), BN 1/0 (SE Linears keep theirs)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0.0, 0.001)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        x = self.la1(self.conv_layer1_2(self.conv_layer1_1(x)))
        feats = [x]
        for index in (1, 2, 3):
            feats = getattr(self, f"st{index + 1}")(getattr(self, f"tr{index}")(feats))
        size = feats[0].shape[-2:]
        upsampled = [
            F.interpolate(f, size, mode="bilinear", align_corners=self.align_corners) for f in feats[1:]
        ]
        return [torch.cat([feats[0]] + upsampled, dim=1)]


@BACKBONES.register
class HRNet_W18_Small_V1(HRNet):
    """PaddleSeg's HRNet_W18_Small_V1: one module per stage, 2 blocks per branch, widths 16-128."""

    SPEC = (
        (1, 32),
        (1, (2, 2), (16, 32)),
        (1, (2, 2, 2), (16, 32, 64)),
        (1, (2, 2, 2, 2), (16, 32, 64, 128)),
    )


@BACKBONES.register
class HRNet_W18_Small_V2(HRNet):
    """PaddleSeg's HRNet_W18_Small_V2: 1, 3 and 2 modules of 2 blocks per branch, widths 18-144."""

    SPEC = (
        (2, 64),
        (1, (2, 2), (18, 36)),
        (3, (2, 2, 2), (18, 36, 72)),
        (2, (2, 2, 2, 2), (18, 36, 72, 144)),
    )


@BACKBONES.register
class HRNet_W18(HRNet):
    """PaddleSeg's HRNet_W18: branch widths 18, 36, 72, 144 (OCRNet's cityscapes / VOC backbone)."""

    SPEC = _wide(18)


@BACKBONES.register
class HRNet_W30(HRNet):
    """PaddleSeg's HRNet_W30: branch widths 30, 60, 120, 240."""

    SPEC = _wide(30)


@BACKBONES.register
class HRNet_W32(HRNet):
    """PaddleSeg's HRNet_W32: branch widths 32, 64, 128, 256."""

    SPEC = _wide(32)


@BACKBONES.register
class HRNet_W40(HRNet):
    """PaddleSeg's HRNet_W40: branch widths 40, 80, 160, 320."""

    SPEC = _wide(40)


@BACKBONES.register
class HRNet_W44(HRNet):
    """PaddleSeg's HRNet_W44: branch widths 44, 88, 176, 352."""

    SPEC = _wide(44)


@BACKBONES.register
class HRNet_W48(HRNet):
    """PaddleSeg's HRNet_W48: branch widths 48, 96, 192, 384 (OCRNet's cityscapes / VOC backbone)."""

    SPEC = _wide(48)


@BACKBONES.register
class HRNet_W60(HRNet):
    """PaddleSeg's HRNet_W60: branch widths 60, 120, 240, 480."""

    SPEC = _wide(60)


@BACKBONES.register
class HRNet_W64(HRNet):
    """PaddleSeg's HRNet_W64: branch widths 64, 128, 256, 512."""

    SPEC = _wide(64)
