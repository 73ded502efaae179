"""ResNet and ResNeXt, the Faster R-CNN backbones (PaddleDetection semantics and parameter names).

Depth 18/34 (BasicBlock) or 50/101/152 (BottleNeck); variant ``a`` (the bottleneck's stride on
its first 1x1), ``b`` (on the 3x3), ``c``/``d`` (a three-conv stem; ``d`` also shortcuts a
strided block through a 2x2 average pool and a 1x1 conv); ResNeXt through ``groups`` and
``base_width`` (64x4d: ``groups 64, base_width 4``). The stem runs at stride 2, a 3x3 max pool
follows, then ``num_stages`` stages ``res2``.. at strides 4/8/16/32; ``return_idx`` picks the
returned maps (0 is res2).

Module names are PaddleDetection's (``conv1.conv1_1.conv``, ``res2.res2a.branch2a.norm``,
``res4.res4b22.short.conv.norm``, ``conv1.res_conv1`` for ResNeXt-a/b), so a ppdist key is
``backbone.`` + the Paddle key and ``.pdparams`` files convert without renames: the model zoo's
(``backbone.`` prefix) and the ImageNet backbones' (none).

``freeze_norm`` (PaddleDetection's default: on) makes every BatchNorm an affine transform with its
running statistics: parameters not trained, statistics never updated (eval mode whatever the
model's mode, ``ppdist.modeling.freezing``). ``freeze_at = k`` freezes the stem and stages 0..k
(``freeze_stem_only``: the stem alone). ``lr_mult_list`` scales each stage's learning rate (the
SSLD configs): the convolutions' weights, and the BatchNorms' parameters when they train (Paddle
gives a frozen norm a rate of 0); ppdist's optimizer reads ``param.lr_mult``. ``norm_decay`` is
the BatchNorms' own L2 factor (``param.regularizer_factor``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.errors import ConfigError
from ppdist.modeling.freezing import FreezableBackbone
from ppdist.modeling.layers import init_paddle_conv_default
from ppdist.registry import BACKBONES

BLOCK_COUNTS = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}
STAGE_WIDTHS = [64, 128, 256, 512]
VARIANTS = ("a", "b", "c", "d")


class ConvNormLayer(nn.Module):
    """Bias-free ``conv`` (padding ``(k - 1) // 2``) -> BatchNorm ``norm`` (eps 1e-5) -> optional ReLU."""

    def __init__(
        self, ch_in: int, ch_out: int, filter_size: int, stride: int, groups: int = 1, act: bool = False
    ) -> None:
        super().__init__()
        padding = (filter_size - 1) // 2
        self.conv = nn.Conv2d(ch_in, ch_out, filter_size, stride, padding, groups=groups, bias=False)
        self.norm = nn.BatchNorm2d(ch_out, eps=1e-5, momentum=0.1)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x))
        return F.relu(x) if self.act else x


def shortcut(ch_in: int, ch_out: int, stride: int, variant: str) -> nn.Module:
    """The projection of a block's first unit: a strided 1x1 ConvNorm, or with variant ``d`` at
    stride 2 a 2x2 average pool (ceil mode, padded cells not counted) and a 1x1 ConvNorm."""
    if variant == "d" and stride == 2:
        pool = nn.AvgPool2d(2, 2, 0, ceil_mode=True, count_include_pad=False)
        return nn.Sequential(OrderedDict(pool=pool, conv=ConvNormLayer(ch_in, ch_out, 1, 1)))
    return ConvNormLayer(ch_in, ch_out, 1, stride)


class BasicBlock(nn.Module):
    """Two 3x3 ConvNorms (``branch2a``, ``branch2b``) plus the identity or ``short``, then ReLU."""

    expansion = 1

    def __init__(
        self, ch_in: int, ch_out: int, stride: int, is_short: bool, variant: str, groups: int, base_width: int
    ) -> None:
        super().__init__()
        if groups != 1 or base_width != 64:
            raise ConfigError(
                f"ResNet: depth 18/34 (BasicBlock) needs groups 1 and base_width 64, got {groups} and {base_width}"
            )
        self.short = None if is_short else shortcut(ch_in, ch_out, stride, variant)
        self.branch2a = ConvNormLayer(ch_in, ch_out, 3, stride, act=True)
        self.branch2b = ConvNormLayer(ch_out, ch_out, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch2b(self.branch2a(x))
        return F.relu(out + (x if self.short is None else self.short(x)))


class BottleNeck(nn.Module):
    """1x1 -> 3x3 (grouped for ResNeXt) -> 1x1 ConvNorms (``branch2a/b/c``) plus the identity or
    ``short``, then ReLU; variant ``a`` strides the first 1x1, the others the 3x3."""

    expansion = 4

    def __init__(
        self, ch_in: int, ch_out: int, stride: int, is_short: bool, variant: str, groups: int, base_width: int
    ) -> None:
        super().__init__()
        stride1, stride2 = (stride, 1) if variant == "a" else (1, stride)
        width = int(ch_out * (base_width / 64.0)) * groups
        self.branch2a = ConvNormLayer(ch_in, width, 1, stride1, act=True)
        self.branch2b = ConvNormLayer(width, width, 3, stride2, groups=groups, act=True)
        self.branch2c = ConvNormLayer(width, ch_out * self.expansion, 1, 1)
        self.short = None if is_short else shortcut(ch_in, ch_out * self.expansion, stride, variant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch2c(self.branch2b(self.branch2a(x)))
        return F.relu(out + (x if self.short is None else self.short(x)))


def block_name(stage_num: int, count: int, index: int) -> str:
    """PaddleDetection's block names: ``res4a``, ``res4b1``.. ``res4b22`` when res4 has over 10
    blocks, else ``res3a``, ``res3b``, ..."""
    if count > 10 and stage_num == 4:
        return "res4a" if index == 0 else f"res4b{index}"
    return f"res{stage_num}{chr(ord('a') + index)}"


def make_stage(
    block: type, ch_in: int, ch_out: int, count: int, stage_num: int, **kwargs: Any
) -> nn.Sequential:
    """One stage ``res<stage_num>``: ``count`` blocks, the first strided (but in res2) and projected."""
    blocks: Dict[str, nn.Module] = OrderedDict()
    for i in range(count):
        stride = 2 if i == 0 and stage_num != 2 else 1
        blocks[block_name(stage_num, count, i)] = block(ch_in, ch_out, stride, i != 0, **kwargs)
        ch_in = ch_out * block.expansion
    return nn.Sequential(blocks)


def _int_list(value: Union[int, Sequence[int]]) -> List[int]:
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


@BACKBONES.register
class ResNet(FreezableBackbone):
    """PaddleDetection's ResNet / ResNeXt (module docs); returns the maps of ``return_idx``."""

    @staticmethod
    def check_values(kwargs: Mapping[str, Any], where: str) -> None:
        """Settings ppdist does not build, refused by name before anything runs."""
        if kwargs.get("norm_type", "bn") != "bn":
            raise ConfigError(
                f"{where}.norm_type {kwargs['norm_type']!r}: ResNet builds BatchNorm ('bn'); for "
                f"sync_bn set Global.use_sync_bn: true (every BatchNorm is synchronised)"
            )
        dcn = kwargs.get("dcn_v2_stages", [-1])
        if _int_list(dcn) != [-1]:
            raise ConfigError(f"{where}.dcn_v2_stages {dcn!r}: deformable convolutions are not supported")
        if kwargs.get("std_senet", False):
            raise ConfigError(f"{where}.std_senet: SE blocks in ResNet are not supported")

    def __init__(
        self,
        depth: int = 50,
        ch_in: int = 64,
        variant: str = "b",
        lr_mult_list: Sequence[float] = (1.0, 1.0, 1.0, 1.0),
        groups: int = 1,
        base_width: int = 64,
        norm_type: str = "bn",
        norm_decay: float = 0.0,
        freeze_norm: bool = True,
        freeze_at: int = 0,
        return_idx: Union[int, Sequence[int]] = (0, 1, 2, 3),
        dcn_v2_stages: Union[int, Sequence[int]] = (-1,),
        num_stages: int = 4,
        std_senet: bool = False,
        freeze_stem_only: bool = False,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        self.check_values(
            {"norm_type": norm_type, "dcn_v2_stages": dcn_v2_stages, "std_senet": std_senet}, "ResNet"
        )
        if depth not in BLOCK_COUNTS:
            raise ConfigError(f"ResNet.depth must be one of {sorted(BLOCK_COUNTS)}, got {depth!r}")
        if variant not in VARIANTS:
            raise ConfigError(f"ResNet.variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        if not 1 <= num_stages <= 4:
            raise ConfigError(f"ResNet.num_stages must be 1..4, got {num_stages!r}")
        self.return_idx = _int_list(return_idx)
        if not self.return_idx or min(self.return_idx) < 0 or max(self.return_idx) >= num_stages:
            raise ConfigError(f"ResNet.return_idx {return_idx!r}: indices must be in 0..{num_stages - 1}")
        if len(lr_mult_list) != 4:
            raise ConfigError(f"ResNet.lr_mult_list must hold 4 values (res2..res5), got {lr_mult_list!r}")
        stem_name = "res_conv1" if groups != 1 else "conv1"
        if variant in ("c", "d"):
            stem = [(in_channels, ch_in // 2, 3, 2, "conv1_1"), (ch_in // 2, ch_in // 2, 3, 1, "conv1_2")]
            stem.append((ch_in // 2, ch_in, 3, 1, "conv1_3"))
        else:
            stem = [(in_channels, ch_in, 7, 2, stem_name)]
        self.conv1 = nn.Sequential(
            OrderedDict((name, ConvNormLayer(i, o, k, s, act=True)) for i, o, k, s, name in stem)
        )
        block = BottleNeck if depth >= 50 else BasicBlock
        widths = [block.expansion * w for w in STAGE_WIDTHS]
        self.stage_names: List[str] = []
        channels = ch_in
        for i in range(num_stages):
            name = f"res{i + 2}"
            stage = make_stage(
                block,
                channels,
                STAGE_WIDTHS[i],
                BLOCK_COUNTS[depth][i],
                i + 2,
                variant=variant,
                groups=groups,
                base_width=base_width,
            )
            self.add_module(name, stage)
            self.stage_names.append(name)
            channels = widths[i]
        self.out_channels = [widths[i] for i in self.return_idx]
        self.out_strides = [4 * 2**i for i in self.return_idx]
        init_paddle_conv_default(self)
        self._lr_mult_list = [float(v) for v in lr_mult_list]
        self._norm_decay = float(norm_decay)
        self._freeze_norm = bool(freeze_norm)
        self.tag_parameters()
        stages = [[getattr(self, name)] for name in self.stage_names]
        frozen = -1 if freeze_at < 0 else 0 if freeze_stem_only else min(freeze_at + 1, num_stages)
        self.freeze([[self.conv1], *stages], frozen_stages=frozen, freeze_norm=freeze_norm)

    def tag_parameters(self) -> None:
        """``regularizer_factor`` (``norm_decay``) on the norms; ``lr_mult`` per stage (module docs)."""
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                for param in (module.weight, module.bias):
                    param.regularizer_factor = self._norm_decay
        for i, name in enumerate(self.stage_names):
            mult = self._lr_mult_list[i]
            if mult == 1.0:
                continue
            for module in getattr(self, name).modules():
                if isinstance(module, nn.Conv2d) or (
                    isinstance(module, nn.BatchNorm2d) and not self._freeze_norm
                ):
                    for param in module.parameters(recurse=False):
                        param.lr_mult = mult

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        self.tag_parameters()  # copy.deepcopy / unpickling drop parameter attributes

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        x = F.max_pool2d(self.conv1(x), kernel_size=3, stride=2, padding=1)
        outs = []
        for i, name in enumerate(self.stage_names):
            x = getattr(self, name)(x)
            if i in self.return_idx:
                outs.append(x)
        return outs
