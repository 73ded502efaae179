"""MixVisionTransformer (MiT B0-B5), SegFormer's hierarchical transformer encoder (PaddleSeg semantics).

Four stages; each embeds its input with an overlapping strided convolution + LayerNorm (7x7/4,
then 3x3/2), runs ``depths[i]`` pre-norm blocks (efficient self-attention whose keys and values
come from a ``sr_ratio``-strided conv of the tokens, then a Mix-FFN with a 3x3 depth-wise conv
between its two Linears) and a final LayerNorm. Output: four NCHW maps at strides 4/8/16/32 with
``embed_dims`` channels. Stochastic depth rises linearly from 0 to ``drop_path_rate`` over all
blocks. Module names are PaddleSeg's, so Paddle keys need no renames (Linear weights are
transposed by the converter); the ImageNet ``mix_vision_transformer_b*.pdparams`` files hold the
same keys without the ``backbone.`` prefix.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.input_size import conv_output_size, smallest_accepted
from ppdist.modeling.layers import DropPath
from ppdist.registry import BACKBONES

BLOCK_NORM_EPS = 1e-6  # the factories' norm_layer (blocks and per-stage norms)
PADDLE_NORM_EPS = 1e-5  # Paddle's LayerNorm default (patch embeddings, spatial-reduction norm)


def tokens_to_map(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``[B, H*W, C]`` tokens -> ``[B, C, H, W]``."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], height, width)


class OverlapPatchEmbed(nn.Module):
    """Strided ``patch_size`` conv (padding ``patch_size // 2``) -> tokens -> LayerNorm."""

    def __init__(self, patch_size: int, stride: int, in_channels: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, embed_dim, patch_size, stride=stride, padding=patch_size // 2)
        self.norm = nn.LayerNorm(embed_dim, eps=PADDLE_NORM_EPS)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, int, int]:
        x = self.proj(x)
        height, width = x.shape[2], x.shape[3]
        return self.norm(x.flatten(2).transpose(1, 2)), height, width


class Attention(nn.Module):
    """Multi-head self-attention whose keys/values are spatially reduced by ``sr_ratio``
    (a ``sr_ratio`` x ``sr_ratio`` strided conv + LayerNorm) when ``sr_ratio > 1``."""

    def __init__(
        self, dim: int, num_heads: int, qkv_bias: bool, attn_drop: float, proj_drop: float, sr_ratio: int
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embedding width {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim, eps=PADDLE_NORM_EPS)

    def forward(self, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        batch, tokens, dim = x.shape
        head_dim = dim // self.num_heads
        q = self.q(x).reshape(batch, tokens, self.num_heads, head_dim).transpose(1, 2)
        source = x
        if self.sr_ratio > 1:
            source = self.norm(self.sr(tokens_to_map(x, height, width)).flatten(2).transpose(1, 2))
        kv = self.kv(source).reshape(batch, -1, 2, self.num_heads, head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(
            q, kv[0], kv[1], dropout_p=self.attn_drop if self.training else 0.0, scale=self.scale
        )
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(batch, tokens, dim)))


class DWConv(nn.Module):
    """3x3 depth-wise conv (with bias) applied to tokens laid out as a map."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        return self.dwconv(tokens_to_map(x, height, width)).flatten(2).transpose(1, 2)


class Mlp(nn.Module):
    """Mix-FFN: Linear -> depth-wise 3x3 -> GELU -> dropout -> Linear -> dropout."""

    def __init__(self, dim: int, hidden: int, drop: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = DWConv(hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        x = self.drop(self.act(self.dwconv(self.fc1(x), height, width)))
        return self.drop(self.fc2(x))


class Block(nn.Module):
    """Pre-norm block: ``x + drop_path(attn(norm1(x)))``, then ``x + drop_path(mlp(norm2(x)))``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        drop: float,
        attn_drop: float,
        drop_path: float,
        sr_ratio: int,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=BLOCK_NORM_EPS)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, drop, sr_ratio)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=BLOCK_NORM_EPS)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)

    def forward(self, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), height, width))
        return x + self.drop_path(self.mlp(self.norm2(x), height, width))


def _check_rate(value: float, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{key} must be a number in [0, 1), got {value!r}")
    return float(value)


class MixVisionTransformer(nn.Module):
    """MiT encoder returning ``[x4, x8, x16, x32]``; ``out_channels`` (= ``feat_channels``) lists their widths."""

    def __init__(
        self,
        embed_dims: Sequence[int],
        num_heads: Sequence[int],
        depths: Sequence[int],
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        mlp_ratios: Sequence[float] = (4, 4, 4, 4),
        qkv_bias: bool = True,
        in_channels: int = 3,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
    ) -> None:
        super().__init__()
        drop_rate = _check_rate(drop_rate, "drop_rate")
        attn_drop_rate = _check_rate(attn_drop_rate, "attn_drop_rate")
        drop_path_rate = _check_rate(drop_path_rate, "drop_path_rate")
        self.depths = list(depths)
        self.sr_ratios = [int(r) for r in sr_ratios[: len(self.depths)]]
        self.out_channels = list(embed_dims)
        self.feat_channels = self.out_channels
        # PaddleSeg: paddle.linspace(0, drop_path_rate, sum(depths)) in float32
        rates = torch.linspace(
            0.0, drop_path_rate, sum(self.depths), dtype=torch.float32, device="cpu"
        ).tolist()
        start, previous = 0, in_channels
        for i, (dim, depth) in enumerate(zip(embed_dims, self.depths), start=1):
            patch, stride = (7, 4) if i == 1 else (3, 2)
            setattr(self, f"patch_embed{i}", OverlapPatchEmbed(patch, stride, previous, dim))
            blocks = [
                Block(
                    dim,
                    num_heads[i - 1],
                    mlp_ratios[i - 1],
                    qkv_bias,
                    drop_rate,
                    attn_drop_rate,
                    rates[start + j],
                    sr_ratios[i - 1],
                )
                for j in range(depth)
            ]
            setattr(self, f"block{i}", nn.ModuleList(blocks))
            setattr(self, f"norm{i}", nn.LayerNorm(dim, eps=BLOCK_NORM_EPS))
            start, previous = start + depth, dim
        self.apply(_init_weights)

    @property
    def min_input_size(self) -> Tuple[int, int]:
        """The smallest image (height, width): every stage's tokens must hold one ``sr_ratio`` x
        ``sr_ratio`` patch for its spatial-reduction conv (SegFormer-B0..B5: 29 x 29)."""

        def accepts(size: int) -> bool:
            for i, ratio in enumerate(self.sr_ratios, start=1):
                embed = getattr(self, f"patch_embed{i}").proj
                size = conv_output_size(size, embed.kernel_size[0], embed.stride[0], embed.padding[0])
                if size < max(ratio, 1):
                    return False
            return True

        side = smallest_accepted(accepts)
        return side, side

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        feats = []
        for i in range(1, len(self.depths) + 1):
            x, height, width = getattr(self, f"patch_embed{i}")(x)
            for block in getattr(self, f"block{i}"):
                x = block(x, height, width)
            x = tokens_to_map(getattr(self, f"norm{i}")(x), height, width)
            feats.append(x)
        return feats


def _init_weights(module: nn.Module) -> None:
    """PaddleSeg's MiT init: Linear trunc-normal(0.02, cut at +-2 std) / bias 0, LayerNorm 1/0,
    conv Normal(0, sqrt(2 / fan_out)) with fan_out = k*k*C_out/groups, bias 0."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02, a=-0.04, b=0.04)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Conv2d):
        fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels // module.groups
        nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / fan_out))
        if module.bias is not None:
            nn.init.zeros_(module.bias)


# PaddleSeg's factories: widths, heads, depths (sr_ratios [8, 4, 2, 1], mlp_ratios 4, qkv_bias)
_B0_WIDTHS = (32, 64, 160, 256)
_WIDTHS = (64, 128, 320, 512)
_HEADS = (1, 2, 5, 8)


def _variant(name: str, embed_dims: Sequence[int], depths: Sequence[int]) -> type:
    def __init__(
        self,
        in_channels: int = 3,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
    ) -> None:
        MixVisionTransformer.__init__(
            self,
            embed_dims,
            _HEADS,
            depths,
            in_channels=in_channels,
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate,
        )

    doc = f"MiT-{name[-2:]}: widths {list(embed_dims)}, depths {list(depths)} (PaddleSeg's ``{name}``)."
    cls = type(name, (MixVisionTransformer,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})
    return BACKBONES.register(cls)


MixVisionTransformer_B0 = _variant("MixVisionTransformer_B0", _B0_WIDTHS, (2, 2, 2, 2))
MixVisionTransformer_B1 = _variant("MixVisionTransformer_B1", _WIDTHS, (2, 2, 2, 2))
MixVisionTransformer_B2 = _variant("MixVisionTransformer_B2", _WIDTHS, (3, 4, 6, 3))
MixVisionTransformer_B3 = _variant("MixVisionTransformer_B3", _WIDTHS, (3, 4, 18, 3))
MixVisionTransformer_B4 = _variant("MixVisionTransformer_B4", _WIDTHS, (3, 8, 27, 3))
MixVisionTransformer_B5 = _variant("MixVisionTransformer_B5", _WIDTHS, (3, 6, 40, 3))
