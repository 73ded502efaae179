"""SegFormer's all-MLP decoder (PaddleSeg's ``SegFormer`` minus ``backbone``).

Input: the MixVisionTransformer's four maps (strides 4/8/16/32). Each goes through a Linear
embedding to ``embedding_dim`` channels, the three coarser ones are upsampled (bilinear,
``align_corners``) to the 1/4 map's size, the four are concatenated (coarsest first), fused by a
1x1 ConvBNReLU, then channel dropout (0.1) and a 1x1 classifier. Output: ``[logits]`` upsampled
to the input size, in training and in eval (PaddleSeg's contract).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.layers import ConvBNAct, init_paddle_conv_default
from ppdist.modeling.paddle_names import PaddleNames
from ppdist.ops.resize import upsample_logits
from ppdist.registry import HEADS

LEVELS = 4


class MLP(nn.Module):
    """Linear embedding of a ``[B, C, H, W]`` map to ``[B, E, H, W]`` (PaddleSeg's ``MLP.proj``)."""

    def __init__(self, input_dim: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_dim, embed_dim)
        nn.init.xavier_uniform_(self.proj.weight)  # Paddle's default Linear init
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, height, width = x.shape
        out = self.proj(x.flatten(2).transpose(1, 2))
        return out.transpose(1, 2).reshape(batch, -1, height, width)


@HEADS.register
class SegFormerHead(nn.Module):
    """SegFormer decoder: ``linear_c1..4`` embeddings, ``linear_fuse`` (ConvBNReLU), ``linear_pred``."""

    # PaddleSeg's ``SegFormer`` holds the decoder's layers at the top of the model, beside
    # ``backbone``; its ``linear_fuse`` is a ``layers.ConvBNReLU`` (``_conv`` / ``_batch_norm``).
    paddle_names = PaddleNames(
        renames=(
            (r"^linear_fuse\.conv\.", "linear_fuse._conv."),
            (r"^linear_fuse\.bn\.", "linear_fuse._batch_norm."),
        ),
        beside_stage=("linear_c1", "linear_c2", "linear_c3", "linear_c4", "linear_fuse", "linear_pred"),
    )

    def __init__(
        self,
        in_channels: Sequence[int],
        num_classes: int,
        embedding_dim: int = 256,
        align_corners: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(in_channels, (list, tuple)) or len(in_channels) != LEVELS:
            raise ValueError(
                f"SegFormerHead needs a backbone returning {LEVELS} feature maps "
                f"(a MixVisionTransformer_B*), got in_channels {in_channels!r}"
            )
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes <= 0:
            raise ValueError(
                f"num_classes must be a positive integer (set Global.num_classes), got {num_classes!r}"
            )
        if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim <= 0:
            raise ValueError(f"embedding_dim must be a positive integer, got {embedding_dim!r}")
        if not isinstance(align_corners, bool):
            raise ValueError(f"align_corners must be true or false, got {align_corners!r}")
        self.align_corners = align_corners
        for i, channels in enumerate(in_channels, start=1):
            setattr(self, f"linear_c{i}", MLP(channels, embedding_dim))
        self.linear_fuse = ConvBNAct(embedding_dim * LEVELS, embedding_dim, 1)
        self.dropout = nn.Dropout2d(0.1)
        self.linear_pred = nn.Conv2d(embedding_dim, num_classes, 1)
        self.out_channels = num_classes
        init_paddle_conv_default(self.linear_fuse)
        init_paddle_conv_default(self.linear_pred)

    def forward(
        self, feats: Sequence[torch.Tensor], input_size: Optional[Sequence[int]] = None
    ) -> List[torch.Tensor]:
        size = feats[0].shape[2:]
        embedded = []
        for i in reversed(range(LEVELS)):  # c4, c3, c2, c1
            x = getattr(self, f"linear_c{i + 1}")(feats[i])
            if i:
                x = F.interpolate(x, size, mode="bilinear", align_corners=self.align_corners)
            embedded.append(x)
        logits = self.linear_pred(self.dropout(self.linear_fuse(torch.cat(embedded, dim=1))))
        out_size = list(input_size) if input_size is not None else [s * 4 for s in size]
        return [upsample_logits(logits, out_size, self.align_corners)]
