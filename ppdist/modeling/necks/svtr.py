"""The ``svtr`` encoder of SequenceEncoder (PaddleOCR's ``EncoderWithSVTR``, PP-OCRv3's neck).

(B, C, H, W) -> (B, dims, H, W): a kxk then 1x1 ConvBN-Swish down to ``hidden_dims``, ``depth``
global-attention transformer blocks over the H*W tokens (pre-norm, LayerNorm eps 1e-5, Swish MLP),
a final LayerNorm (eps 1e-6), a 1x1 ConvBN back to C, then the input concatenated with it and a
kxk and a 1x1 ConvBN down to ``dims``. ``use_guide`` reads the input without letting gradients
flow back into the backbone (Paddle's ``stop_gradient`` copy). Attribute names are Paddle's.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
from torch import nn

from ppdist.modeling.layers import DropPath

KernelSize = Union[int, Sequence[int]]


class ConvBNSwish(nn.Module):
    """Bias-free Conv2d (Paddle's KaimingUniform) -> BatchNorm2d -> Swish (SiLU)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: KernelSize = 1, padding: KernelSize = 0
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding, bias=False)
        self.norm = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
        self.act = nn.SiLU()
        nn.init.kaiming_uniform_(self.conv.weight, mode="fan_in", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


class Attention(nn.Module):
    """Global multi-head self-attention; ``qk_scale`` defaults to head_dim ** -0.5."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool,
        qk_scale: Optional[float],
        attn_drop: float,
        proj_drop: float,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = qk_scale or self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        query, key, value = qkv[0] * self.scale, qkv[1], qkv[2]
        attn = self.attn_drop(torch.softmax(query @ key.transpose(-2, -1), dim=-1))
        x = (attn @ value).transpose(1, 2).reshape(batch, tokens, self.num_heads * self.head_dim)
        return self.proj_drop(self.proj(x))


class Mlp(nn.Module):
    """Linear -> Swish -> dropout -> Linear -> dropout."""

    def __init__(self, dim: int, hidden: int, drop: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.SiLU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        qk_scale: Optional[float],
        drop: float,
        attn_drop: float,
        drop_path: float,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.mixer = Attention(dim, num_heads, qkv_bias, qk_scale, attn_drop, drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.mixer(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


def _kernel(kernel_size: KernelSize) -> List[int]:
    if isinstance(kernel_size, int) and not isinstance(kernel_size, bool):
        kernel_size = [kernel_size, kernel_size]
    if (
        not isinstance(kernel_size, (list, tuple))
        or len(kernel_size) != 2
        or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in kernel_size)
    ):
        raise ValueError(f"svtr kernel_size must be [height, width] of positive ints, got {kernel_size!r}")
    return [int(k) for k in kernel_size]


class EncoderWithSVTR(nn.Module):
    """(B, C, H, W) -> (B, dims, H, W); see the module docstring."""

    def __init__(
        self,
        in_channels: int,
        dims: int = 64,
        depth: int = 2,
        hidden_dims: int = 120,
        use_guide: bool = False,
        num_heads: int = 8,
        qkv_bias: bool = True,
        mlp_ratio: float = 2.0,
        drop_rate: float = 0.1,
        attn_drop_rate: float = 0.1,
        drop_path: float = 0.0,
        kernel_size: KernelSize = (3, 3),
        qk_scale: Optional[float] = None,
    ) -> None:
        super().__init__()
        for key, value in (
            ("dims", dims),
            ("depth", depth),
            ("hidden_dims", hidden_dims),
            ("num_heads", num_heads),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "depth" else 1):
                raise ValueError(f"svtr {key} must be a positive int, got {value!r}")
        if hidden_dims % num_heads:
            raise ValueError(
                f"svtr hidden_dims ({hidden_dims}) must be a multiple of num_heads ({num_heads})"
            )
        if in_channels < 8:
            raise ValueError(f"svtr needs at least 8 input channels (it reduces them 8x), got {in_channels}")
        kernel = _kernel(kernel_size)
        padding = (kernel[0] // 2, kernel[1] // 2)
        self.depth = depth
        self.use_guide = use_guide
        self.conv1 = ConvBNSwish(in_channels, in_channels // 8, kernel, padding)
        self.conv2 = ConvBNSwish(in_channels // 8, hidden_dims)
        self.svtr_block = nn.ModuleList(
            Block(hidden_dims, num_heads, mlp_ratio, qkv_bias, qk_scale, drop_rate, attn_drop_rate, drop_path)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(hidden_dims, eps=1e-6)
        self.conv3 = ConvBNSwish(hidden_dims, in_channels)
        self.conv4 = ConvBNSwish(2 * in_channels, in_channels // 8, kernel, padding)
        self.conv1x1 = ConvBNSwish(in_channels // 8, dims)
        self.out_channels = dims
        for module in self.modules():
            if isinstance(module, nn.Linear):  # Paddle's TruncatedNormal(std=0.02): cut at 2 std
                nn.init.trunc_normal_(module.weight, std=0.02, a=-0.04, b=0.04)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x.detach() if self.use_guide else x
        z = self.conv2(self.conv1(shortcut))
        batch, channels, height, width = z.shape
        z = z.flatten(2).transpose(1, 2)
        for block in self.svtr_block:
            z = block(z)
        z = self.norm(z).transpose(1, 2).reshape(batch, channels, height, width)
        z = torch.cat((shortcut, self.conv3(z)), dim=1)
        return self.conv1x1(self.conv4(z))
