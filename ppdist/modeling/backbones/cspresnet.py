"""CSPResNet, the PP-YOLOE backbone (PaddleDetection semantics).

A stem (three 3x3 ConvBNs, or two without ``use_large_stem``) at stride 2, then four
``CSPResStage``s that each halve the resolution, giving maps at strides 4/8/16/32.
Widths and depths are scaled by ``width_mult`` / ``depth_mult`` with Python ``round``
(at least 1). Each residual block ends in a ``RepVggBlock`` (3x3 + 1x1 branches), which
``convert_to_deploy`` folds into a single biased 3x3 convolution.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.freezing import FreezableBackbone
from ppdist.modeling.layers import (
    NormNoDecayModule,
    hard_sigmoid_paddle,
    init_paddle_conv_default,
    make_activation,
    tag_norm_no_decay,
)
from ppdist.modeling.paddle_names import PaddleNames
from ppdist.registry import BACKBONES

# Paddle's ``F.hardsigmoid`` default slope 0.1666667 (a float32 attribute), not PyTorch's 1/6: 2 float32 ulp apart,
# a difference tests/convert/test_det_equivalence.py's float64 comparison sees (1e-6..6e-6 px on its boxes)
PADDLE_HARDSIGMOID_SLOPE = torch.tensor(0.1666667, dtype=torch.float32).item()


class PaddleHardSigmoid(nn.Module):
    """Paddle's ``hardsigmoid``: ``clamp(x * 0.1666667 + 0.5, 0, 1)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return hard_sigmoid_paddle(x, PADDLE_HARDSIGMOID_SLOPE, 0.5)


def get_activation(act: Optional[str]) -> nn.Module:
    """Activation by Paddle name: ``swish`` (x * sigmoid x), ``hardsigmoid`` (Paddle's, see above), ..."""
    if act in ("swish", "silu"):
        return nn.SiLU()
    if act == "hardsigmoid":
        return PaddleHardSigmoid()
    if act in ("leaky", "leaky_relu"):
        return nn.LeakyReLU(0.1)
    return make_activation(act)


def scale_width(channels: Sequence[int], width_mult: float) -> List[int]:
    """``max(round(c * width_mult), 1)`` for each width."""
    return [max(round(c * width_mult), 1) for c in channels]


def scale_depth(depth: int, depth_mult: float) -> int:
    """``max(round(depth * depth_mult), 1)``."""
    return max(round(depth * depth_mult), 1)


class ConvBN(nn.Module):
    """Bias-free Conv2d -> BatchNorm2d (eps 1e-5, momentum 0.1) -> activation."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        stride: int = 1,
        padding: int = 0,
        groups: int = 1,
        act: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, groups=groups, bias=False
        )
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
        self.act = get_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


def fuse_conv_bn(branch: ConvBN) -> tuple:
    """The (kernel, bias) of ``branch``'s conv with its BatchNorm (running stats) folded in."""
    bn = branch.bn
    std = (bn.running_var + bn.eps).sqrt()
    scale = bn.weight / std
    return branch.conv.weight * scale.reshape(-1, 1, 1, 1), bn.bias - bn.running_mean * scale


class RepVggBlock(nn.Module):
    """``act(ConvBN3x3(x) + [alpha *] ConvBN1x1(x))``; ``convert_to_deploy`` makes it one 3x3 conv."""

    def __init__(
        self, in_channels: int, out_channels: int, act: Optional[str] = "relu", use_alpha: bool = False
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.conv1 = ConvBN(in_channels, out_channels, 3, padding=1, act=None)
        self.conv2 = ConvBN(in_channels, out_channels, 1, padding=0, act=None)
        self.alpha = nn.Parameter(torch.ones(1)) if use_alpha else None
        self.act = get_activation(act)
        self.conv: Optional[nn.Conv2d] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv is not None:
            return self.act(self.conv(x))
        y2 = self.conv2(x)
        if self.alpha is not None:
            y2 = self.alpha * y2
        return self.act(self.conv1(x) + y2)

    def equivalent_kernel_bias(self) -> tuple:
        """The single 3x3 (kernel, bias) equal to both branches in eval mode."""
        k3, b3 = fuse_conv_bn(self.conv1)
        k1, b1 = fuse_conv_bn(self.conv2)
        k1 = F.pad(k1, [1, 1, 1, 1])
        if self.alpha is not None:
            k1, b1 = self.alpha * k1, self.alpha * b1
        return k3 + k1, b3 + b1

    @torch.no_grad()
    def convert_to_deploy(self) -> None:
        """Replace both branches (and alpha) by one biased 3x3 conv; idempotent."""
        if self.conv is not None:
            return
        kernel, bias = self.equivalent_kernel_bias()
        weight = self.conv1.conv.weight
        conv = nn.Conv2d(
            self.in_channels,
            self.out_channels,
            3,
            padding=1,
            bias=True,
            device=weight.device,
            dtype=weight.dtype,
        )
        conv.weight.copy_(kernel)
        conv.bias.copy_(bias)
        del self.conv1, self.conv2
        self.alpha = None
        self.conv = conv


class BasicBlock(nn.Module):
    """3x3 ConvBN+act -> RepVggBlock, plus the input when ``shortcut``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        act: Optional[str] = "relu",
        shortcut: bool = True,
        use_alpha: bool = False,
    ) -> None:
        super().__init__()
        if shortcut and in_channels != out_channels:
            raise ValueError(f"BasicBlock shortcut needs equal widths, got {in_channels} -> {out_channels}")
        self.conv1 = ConvBN(in_channels, out_channels, 3, padding=1, act=act)
        self.conv2 = RepVggBlock(out_channels, out_channels, act=act, use_alpha=use_alpha)
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return x + y if self.shortcut else y


class EffectiveSELayer(nn.Module):
    """Effective squeeze-excitation: ``x * hardsigmoid(fc(mean_hw(x)))`` with a biased 1x1 fc (Paddle's
    hardsigmoid, slope 0.1666667)."""

    def __init__(self, channels: int, act: str = "hardsigmoid") -> None:
        super().__init__()
        self.fc = nn.Conv2d(channels, channels, 1, bias=True)
        self.act = get_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.act(self.fc(x.mean((2, 3), keepdim=True)))


class CSPResStage(nn.Module):
    """Stride-2 ConvBN to ``mid = (cin + cout) // 2``, two 1x1 halves (one through ``n``
    BasicBlocks), concat, effective SE, 1x1 ConvBN to ``cout``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        n: int,
        stride: int = 2,
        act: Optional[str] = "swish",
        use_attn: bool = True,
        use_alpha: bool = False,
    ) -> None:
        super().__init__()
        mid = (in_channels + out_channels) // 2
        self.conv_down = ConvBN(in_channels, mid, 3, stride=2, padding=1, act=act) if stride == 2 else None
        self.conv1 = ConvBN(mid, mid // 2, 1, act=act)
        self.conv2 = ConvBN(mid, mid // 2, 1, act=act)
        self.blocks = nn.Sequential(
            *[BasicBlock(mid // 2, mid // 2, act=act, shortcut=True, use_alpha=use_alpha) for _ in range(n)]
        )
        self.attn = EffectiveSELayer(mid) if use_attn else None
        self.conv3 = ConvBN(mid, out_channels, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv_down is not None:
            x = self.conv_down(x)
        y = torch.cat([self.conv1(x), self.blocks(self.conv2(x))], dim=1)
        if self.attn is not None:
            y = self.attn(y)
        return self.conv3(y)


@BACKBONES.register
class CSPResNet(FreezableBackbone, NormNoDecayModule):
    """CSPResNet returning the maps of the stages in ``return_idx`` (default strides 8/16/32).

    Units for ``freeze_at`` / ``frozen_stages`` / ``freeze_norm`` (``ppdist.modeling.freezing``):
    the stem, then the 4 stages."""

    # PaddleDetection names the stem layers ``conv1``, ``conv2`` (, ``conv3`` with use_large_stem) where
    # ppdist's ``stem`` is an indexed Sequential. Everything else (``stages.N.{conv_down, conv1, conv2,
    # blocks.M.{conv1, conv2.{conv1, conv2, alpha}}, attn.fc, conv3}``) keeps PaddleDetection's names;
    # tests/convert/test_det_equivalence.py checks them against PaddleDetection's model.
    paddle_names = PaddleNames(
        renames=(
            (r"^stem\.0\.", "stem.conv1."),
            (r"^stem\.1\.", "stem.conv2."),
            (r"^stem\.2\.", "stem.conv3."),
        )
    )

    def __init__(
        self,
        in_channels: int = 3,
        layers: Sequence[int] = (3, 6, 6, 3),
        channels: Sequence[int] = (64, 128, 256, 512, 1024),
        act: str = "swish",
        return_idx: Sequence[int] = (1, 2, 3),
        use_large_stem: bool = True,
        width_mult: float = 1.0,
        depth_mult: float = 1.0,
        use_alpha: bool = False,
        freeze_at: Optional[int] = None,
        frozen_stages: Optional[int] = None,
        freeze_norm: bool = False,
    ) -> None:
        super().__init__()
        if len(channels) != len(layers) + 1:
            raise ValueError(
                f"CSPResNet needs len(channels) == len(layers) + 1, got {len(channels)} and {len(layers)}"
            )
        num_stages = len(layers)
        if not return_idx or any(not 0 <= i < num_stages for i in return_idx):
            raise ValueError(f"return_idx {list(return_idx)} must index the {num_stages} stages")
        channels = scale_width(channels, width_mult)
        layers = [scale_depth(n, depth_mult) for n in layers]
        c0 = channels[0]
        stem = [ConvBN(in_channels, c0 // 2, 3, stride=2, padding=1, act=act)]
        if use_large_stem:
            stem.append(ConvBN(c0 // 2, c0 // 2, 3, padding=1, act=act))
        stem.append(ConvBN(c0 // 2, c0, 3, padding=1, act=act))
        self.stem = nn.Sequential(*stem)
        self.stages = nn.Sequential(
            *[
                CSPResStage(channels[i], channels[i + 1], layers[i], stride=2, act=act, use_alpha=use_alpha)
                for i in range(num_stages)
            ]
        )
        self.return_idx = list(return_idx)
        self.out_channels = [channels[i + 1] for i in self.return_idx]
        self.strides = [4 * 2**i for i in self.return_idx]
        init_paddle_conv_default(self)
        tag_norm_no_decay(self)
        self.freeze([[self.stem], *[[stage] for stage in self.stages]], freeze_at, frozen_stages, freeze_norm)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for idx, stage in enumerate(self.stages):
            x = stage(x)
            if idx in self.return_idx:
                outs.append(x)
        return outs
