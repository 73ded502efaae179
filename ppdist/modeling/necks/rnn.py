"""Sequence encoder neck: feature map (B, C, 1, W) -> sequence (B, W, D)."""

from __future__ import annotations

import inspect
from typing import List, Optional, Union

import torch
from torch import nn

from ppdist.modeling.layers import L2TaggedModule, init_linear_uniform
from ppdist.modeling.necks.svtr import EncoderWithSVTR
from ppdist.registry import NECKS

ENCODER_TYPES = ("reshape", "rnn", "fc", "svtr")
SVTR_KEYS = tuple(k for k in inspect.signature(EncoderWithSVTR).parameters if k != "in_channels")


class Im2Seq(nn.Module):
    """(B, C, 1, W) -> (B, W, C); the feature height must already be 1."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.out_channels = in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[2] != 1:
            raise ValueError(
                f"Im2Seq expects a (B, C, 1, W) feature map, got shape {tuple(x.shape)}; the "
                "backbone must reduce the height to 1 (recognition images are 32 pixels high)"
            )
        return x.squeeze(2).transpose(1, 2)


class EncoderWithRNN(nn.Module):
    """Two-layer bidirectional LSTM (batch first, no dropout); output width 2 * hidden."""

    def __init__(self, in_channels: int, hidden_size: int) -> None:
        super().__init__()
        self.out_channels = hidden_size * 2
        self.lstm = nn.LSTM(in_channels, hidden_size, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


class EncoderWithFC(L2TaggedModule):
    """A Linear projection to ``hidden_size`` (L2 factor 1e-5 on its parameters, as Paddle)."""

    def __init__(self, in_channels: int, hidden_size: int) -> None:
        super().__init__()
        self.out_channels = hidden_size
        self.fc = nn.Linear(in_channels, hidden_size)
        init_linear_uniform(self.fc)
        self.regularizer_factor = 1e-5
        self.tag_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


@NECKS.register(name="SequenceEncoder")
class SequenceEncoder(nn.Module):
    """Im2Seq followed by an optional encoder: ``reshape`` (none), ``rnn`` or ``fc``; or the ``svtr``
    encoder on the feature map followed by Im2Seq. The svtr settings (``dims`` ... ``qk_scale``,
    see ``EncoderWithSVTR``) are named here so that the registry checks them before anything is
    built; left None they take svtr's defaults, and no other encoder takes them."""

    def __init__(
        self,
        in_channels: int,
        encoder_type: str = "rnn",
        hidden_size: int = 48,
        dims: Optional[int] = None,
        depth: Optional[int] = None,
        hidden_dims: Optional[int] = None,
        use_guide: Optional[bool] = None,
        num_heads: Optional[int] = None,
        qkv_bias: Optional[bool] = None,
        mlp_ratio: Optional[float] = None,
        drop_rate: Optional[float] = None,
        attn_drop_rate: Optional[float] = None,
        drop_path: Optional[float] = None,
        kernel_size: Optional[Union[int, List[int]]] = None,
        qk_scale: Optional[float] = None,
    ) -> None:
        super().__init__()
        if encoder_type not in ENCODER_TYPES:
            raise ValueError(
                f"SequenceEncoder.encoder_type must be one of {ENCODER_TYPES}, got "
                f"{encoder_type!r} (cascadernn is not supported yet)"
            )
        if hidden_size < 1:
            raise ValueError(f"SequenceEncoder.hidden_size must be positive, got {hidden_size}")
        svtr = dict(
            dims=dims,
            depth=depth,
            hidden_dims=hidden_dims,
            use_guide=use_guide,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            mlp_ratio=mlp_ratio,
            drop_rate=drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path=drop_path,
            kernel_size=kernel_size,
            qk_scale=qk_scale,
        )
        given = {key: value for key, value in svtr.items() if value is not None}
        if given and encoder_type != "svtr":
            raise ValueError(
                f"SequenceEncoder: {sorted(given)[0]} is a key of encoder_type svtr, not {encoder_type!r}"
            )
        self.encoder_type = encoder_type
        self.encoder_reshape = Im2Seq(in_channels)
        if encoder_type == "svtr":
            self.encoder = EncoderWithSVTR(in_channels, **given)
            self.out_channels = self.encoder.out_channels
        elif encoder_type == "reshape":
            self.encoder = None
            self.out_channels = in_channels
        else:
            encoder_cls = EncoderWithRNN if encoder_type == "rnn" else EncoderWithFC
            self.encoder = encoder_cls(in_channels, hidden_size)
            self.out_channels = self.encoder.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.encoder_type == "svtr":
            return self.encoder_reshape(self.encoder(x))
        x = self.encoder_reshape(x)
        return x if self.encoder is None else self.encoder(x)
