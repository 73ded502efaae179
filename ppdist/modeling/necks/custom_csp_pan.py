"""CustomCSPPAN, the PP-YOLOE neck (PaddleDetection semantics).

A top-down path (CSPStage on C5, then route 1x1 ConvBN -> nearest x2 upsample -> concat
with the next finer map -> CSPStage) followed by a bottom-up path (3x3 stride-2 ConvBN ->
concat -> CSPStage). Input: backbone maps finest first ``[s8, s16, s32]``; output
coarsest first ``[s32, s16, s8]``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.backbones.cspresnet import BasicBlock, ConvBN, scale_depth, scale_width
from ppdist.modeling.layers import NormNoDecayModule, init_paddle_conv_default, tag_norm_no_decay
from ppdist.registry import NECKS


class SPP(nn.Module):
    """Concat of x and its stride-1 max pools (5/9/13), then a ConvBN to ``out_channels``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 1,
        pool_sizes: Sequence[int] = (5, 9, 13),
        act: Optional[str] = "swish",
    ) -> None:
        super().__init__()
        self.pools = nn.ModuleList(nn.MaxPool2d(size, stride=1, padding=size // 2) for size in pool_sizes)
        self.conv = ConvBN(in_channels, out_channels, kernel_size, padding=kernel_size // 2, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([x] + [pool(x) for pool in self.pools], dim=1))


class CSPStage(nn.Module):
    """Two 1x1 ConvBNs to ``cout // 2``; one passes ``n`` BasicBlocks (no shortcut, optional
    SPP after block ``(n - 1) // 2``); concat; 1x1 ConvBN to ``cout``.

    ``convs`` names its blocks by block index and the SPP ``spp`` (``convs.0``, ``convs.spp``,
    ``convs.1``...), as PaddleDetection does, so the keys do not shift with the SPP's position."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        n: int,
        act: Optional[str] = "swish",
        spp: bool = False,
        use_alpha: bool = False,
    ) -> None:
        super().__init__()
        mid = out_channels // 2
        self.conv1 = ConvBN(in_channels, mid, 1, act=act)
        self.conv2 = ConvBN(in_channels, mid, 1, act=act)
        blocks: Dict[str, nn.Module] = OrderedDict()
        for i in range(n):
            blocks[str(i)] = BasicBlock(mid, mid, act=act, shortcut=False, use_alpha=use_alpha)
            if spp and i == (n - 1) // 2:
                blocks["spp"] = SPP(mid * 4, mid, 1, (5, 9, 13), act=act)
        self.convs = nn.Sequential(blocks)
        self.conv3 = ConvBN(mid * 2, out_channels, 1, act=act)
        if spp:
            self._register_load_state_dict_pre_hook(self.upgrade_legacy_keys)

    def upgrade_legacy_keys(self, state_dict: Dict[str, torch.Tensor], prefix: str, *args: object) -> None:
        """Checkpoints written before ppdist named the SPP ``spp`` held ``convs`` positionally (the SPP
        at index ``(n - 1) // 2 + 1``, later blocks shifted by one): read them under today's names."""
        names = list(self.convs._modules)
        marker = prefix + "convs."
        if "spp" not in names or any(key.startswith(marker + "spp.") for key in state_dict):
            return
        spp_position = names.index("spp")
        renames = {}
        for key in state_dict:
            if not key.startswith(marker):
                continue
            index, _, rest = key[len(marker) :].partition(".")
            if not index.isdigit() or int(index) < spp_position:
                continue
            name = "spp" if int(index) == spp_position else str(int(index) - 1)
            renames[key] = f"{marker}{name}.{rest}"
        for old_key, new_key in renames.items():
            state_dict[new_key] = state_dict.pop(old_key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(torch.cat([self.conv1(x), self.convs(self.conv2(x))], dim=1))


def _stage(
    in_channels: int,
    out_channels: int,
    stage_num: int,
    block_num: int,
    act: Optional[str],
    spp: bool,
    use_alpha: bool,
) -> nn.Sequential:
    return nn.Sequential(
        *[
            CSPStage(
                in_channels if j == 0 else out_channels,
                out_channels,
                block_num,
                act=act,
                spp=spp,
                use_alpha=use_alpha,
            )
            for j in range(stage_num)
        ]
    )


@NECKS.register
class CustomCSPPAN(NormNoDecayModule):
    """PAN over the backbone maps; ``out_channels`` lists the outputs' widths, coarsest first."""

    # Paddle names: PaddleDetection's own (``fpn_stages`` / ``fpn_routes`` / ``pan_stages`` /
    # ``pan_routes`` with ``convs.{N, spp}``), so no ``paddle_names`` (see ppdist.modeling.paddle_names).

    def __init__(
        self,
        in_channels: Sequence[int],
        out_channels: Sequence[int] = (768, 384, 192),
        stage_num: int = 1,
        block_num: int = 3,
        act: str = "swish",
        spp: bool = True,
        width_mult: float = 1.0,
        depth_mult: float = 1.0,
        use_alpha: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(in_channels, (list, tuple)) or len(in_channels) < 2:
            raise ValueError("CustomCSPPAN needs a backbone returning a list of >= 2 feature maps")
        if len(out_channels) != len(in_channels):
            raise ValueError(
                f"CustomCSPPAN: {len(in_channels)} input maps but {len(out_channels)} out_channels"
            )
        outs = scale_width(out_channels, width_mult)
        block_num = scale_depth(block_num, depth_mult)
        self.num_levels = len(in_channels)
        ins = list(in_channels)[::-1]  # coarsest first

        self.fpn_stages = nn.ModuleList()
        self.fpn_routes = nn.ModuleList()
        prev = 0
        for i, (c_in, c_out) in enumerate(zip(ins, outs)):
            if i > 0:
                c_in += prev // 2
            self.fpn_stages.append(_stage(c_in, c_out, stage_num, block_num, act, spp and i == 0, use_alpha))
            if i < self.num_levels - 1:
                self.fpn_routes.append(ConvBN(c_out, c_out // 2, 1, act=act))
            prev = c_out

        pan_stages, pan_routes = [], []
        for i in reversed(range(self.num_levels - 1)):
            pan_routes.append(ConvBN(outs[i + 1], outs[i + 1], 3, stride=2, padding=1, act=act))
            pan_stages.append(
                _stage(outs[i] + outs[i + 1], outs[i], stage_num, block_num, act, False, use_alpha)
            )
        self.pan_stages = nn.ModuleList(pan_stages[::-1])
        self.pan_routes = nn.ModuleList(pan_routes[::-1])
        self.out_channels = outs
        init_paddle_conv_default(self)
        tag_norm_no_decay(self)

    def forward(self, feats: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        feats = list(feats)[::-1]
        fpn_feats = []
        route: Optional[torch.Tensor] = None
        for i, feat in enumerate(feats):
            if route is not None:
                # nearest upsampling to the finer map (x2 whenever the input divides by 32)
                route = F.interpolate(route, size=feat.shape[-2:], mode="nearest")
                feat = torch.cat([route, feat], dim=1)
            route = self.fpn_stages[i](feat)
            fpn_feats.append(route)
            if i < self.num_levels - 1:
                route = self.fpn_routes[i](route)

        pan_feats = [fpn_feats[-1]]
        route = fpn_feats[-1]
        for i in reversed(range(self.num_levels - 1)):
            route = self.pan_routes[i](route)
            route = self.pan_stages[i](torch.cat([route, fpn_feats[i]], dim=1))
            pan_feats.append(route)
        return pan_feats[::-1]
