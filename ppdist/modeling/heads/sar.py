"""SAR head (PaddleOCR's SARHead, "Show, Attend and Read"): an RNN encoder of the feature map's
columns and a parallel decoder with 2-D attention over the whole map.

Attribute names are PaddleOCR's (``encoder.rnn_encoder``, ``encoder.linear``,
``decoder.conv1x1_1``, ``decoder.conv3x3_1``, ``decoder.conv1x1_2``, ``decoder.rnn_decoder``,
``decoder.embedding``, ``decoder.prediction``), so state-dict keys match Paddle's; the RNN
tensors' two Paddle name forms are the weights converter's per-layer rule.

PaddleOCR loops over the samples' valid ratios in Python; here the valid width of each sample is
a tensor (``valid_widths``) and the masks are fixed-shape, so a training step reads nothing on the
host.
"""

from __future__ import annotations

import math
from typing import List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.layers import init_paddle_conv_default
from ppdist.registry import HEADS

RNN_LAYERS = 2


def make_rnn(gru: bool, input_size: int, hidden_size: int, bidirectional: bool, dropout: float) -> nn.RNNBase:
    """Paddle's two-layer, batch-first ``nn.LSTM``/``nn.GRU`` (same gate order and default init)."""
    cls = nn.GRU if gru else nn.LSTM
    return cls(
        input_size,
        hidden_size,
        num_layers=RNN_LAYERS,
        batch_first=True,
        dropout=dropout,
        bidirectional=bidirectional,
    )


def valid_widths(valid_ratio: torch.Tensor, width: int, device: torch.device) -> torch.Tensor:
    """``min(width, ceil(ratio * width))`` per sample (int64), in fp32 arithmetic as Paddle computes it.

    fp32 matters at exact products: 0.6 * 40 is 24 in fp32 (25 in fp64).
    """
    ratio = valid_ratio.to(device=device, dtype=torch.float32, non_blocking=True).reshape(-1)
    return torch.clamp(torch.ceil(ratio * width), max=width).long()


def beyond_valid_width(
    valid_ratio: Optional[torch.Tensor], width: int, device: torch.device
) -> Optional[torch.Tensor]:
    """(B, width) bool, True at the columns past each sample's valid width; None without ratios."""
    if valid_ratio is None:
        return None
    columns = torch.arange(width, device=device)
    return columns.unsqueeze(0) >= valid_widths(valid_ratio, width, device).unsqueeze(1)


class PaddleEmbedding(nn.Embedding):
    """``nn.Embedding`` with Paddle's ``padding_idx``: the padding index embeds to zeros whatever
    its stored row holds (a converted Paddle file may hold any values there), and gets no gradient."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = super().forward(ids)
        if self.padding_idx is None:
            return out
        return out.masked_fill((ids == self.padding_idx).unsqueeze(-1), 0.0)


class SAREncoder(nn.Module):
    """Column features (max over the height) -> RNN -> the step at each sample's valid width -> Linear."""

    def __init__(
        self,
        enc_bi_rnn: bool = False,
        enc_drop_rnn: float = 0.1,
        enc_gru: bool = False,
        d_model: int = 512,
        d_enc: int = 512,
    ) -> None:
        super().__init__()
        self.rnn_encoder = make_rnn(enc_gru, d_model, d_enc, enc_bi_rnn, enc_drop_rnn)
        out_size = d_enc * (int(enc_bi_rnn) + 1)
        self.linear = nn.Linear(out_size, out_size)

    def forward(self, feat: torch.Tensor, valid_ratio: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, C, H, W) -> the holistic feature (B, D)."""
        columns = F.max_pool2d(feat, kernel_size=(feat.shape[2], 1), stride=1).squeeze(2).transpose(1, 2)
        steps = self.rnn_encoder(columns)[0]  # (B, W, D)
        length = steps.shape[1]
        if valid_ratio is None:
            last = steps[:, -1]
        else:
            # a ratio of 0 gives step -1, which Paddle's indexing reads as the last step
            index = torch.remainder(valid_widths(valid_ratio, length, steps.device) - 1, length)
            last = steps.gather(1, index.view(-1, 1, 1).expand(-1, 1, steps.shape[2])).squeeze(1)
        return self.linear(last)


class ParallelSARDecoder(nn.Module):
    """2-D attention decoder: teacher-forced in training, greedy step by step in eval.

    Classes: ``out_channels`` = characters + unknown + start (``out_channels - 2``) + padding
    (``out_channels - 1``); it predicts ``out_channels - 1`` classes (no padding).
    """

    def __init__(
        self,
        out_channels: int,
        enc_bi_rnn: bool = False,
        dec_bi_rnn: bool = False,
        dec_drop_rnn: float = 0.0,
        dec_gru: bool = False,
        d_model: int = 512,
        d_enc: int = 512,
        d_k: int = 64,
        pred_dropout: float = 0.1,
        max_text_length: int = 30,
        pred_concat: bool = True,
    ) -> None:
        super().__init__()
        self.num_classes = out_channels
        self.start_idx = out_channels - 2
        self.padding_idx = out_channels - 1
        self.max_seq_len = max_text_length
        self.pred_concat = pred_concat
        enc_out = d_enc * (int(enc_bi_rnn) + 1)
        dec_out = enc_out * (int(dec_bi_rnn) + 1)
        self.conv1x1_1 = nn.Linear(dec_out, d_k)
        self.conv3x3_1 = nn.Conv2d(d_model, d_k, kernel_size=3, stride=1, padding=1)
        self.conv1x1_2 = nn.Linear(d_k, 1)
        self.rnn_decoder = make_rnn(dec_gru, enc_out, enc_out, dec_bi_rnn, dec_drop_rnn)
        self.embedding = PaddleEmbedding(out_channels, enc_out, padding_idx=self.padding_idx)
        self.pred_dropout = nn.Dropout(pred_dropout)
        fc_in = dec_out + d_model + enc_out if pred_concat else d_model
        self.prediction = nn.Linear(fc_in, out_channels - 1)

    def attend(
        self,
        y: torch.Tensor,
        feat: torch.Tensor,
        attn_key: torch.Tensor,
        holistic: torch.Tensor,
        beyond: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """Class scores (B, L, out_channels - 1) of the decoder RNN's outputs ``y`` (B, L, D).

        ``attn_key`` is ``conv3x3_1(feat)``; ``beyond`` masks the columns past the valid width.
        """
        query = self.conv1x1_1(y)  # (B, L, d_k)
        energy = torch.tanh(attn_key.unsqueeze(1) + query[..., None, None])  # (B, L, d_k, H, W)
        score = self.conv1x1_2(energy.permute(0, 1, 3, 4, 2)).squeeze(-1)  # (B, L, H, W)
        if beyond is not None:
            score = score.masked_fill(beyond[:, None, None, :], float("-inf"))
        batch, steps, height, width = score.shape
        weight = torch.softmax(score.reshape(batch, steps, height * width), dim=-1)
        weight = weight.reshape(batch, steps, height, width).to(feat.dtype)
        glimpse = torch.einsum("bchw,blhw->blc", feat, weight)  # (B, L, C)
        if self.pred_concat:
            holistic = holistic.unsqueeze(1).expand(-1, steps, -1)
            return self.prediction(torch.cat((y, glimpse.to(y.dtype), holistic.to(y.dtype)), dim=2))
        return self.prediction(glimpse)

    def forward_train(
        self,
        feat: torch.Tensor,
        out_enc: torch.Tensor,
        label: torch.Tensor,
        valid_ratio: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """Teacher forcing: inputs [holistic, label embeddings]; scores (B, label length, out_channels - 1)."""
        # the tokens in the holistic feature's dtype (Paddle casts that one to the embedding's: the
        # same in fp32; under CPU fp16 autocast torch's LSTM refuses fp32 inputs)
        embedded = self.embedding(label).to(out_enc.dtype)
        y = self.rnn_decoder(torch.cat((out_enc.unsqueeze(1), embedded), dim=1))[0]
        beyond = beyond_valid_width(valid_ratio, feat.shape[3], feat.device)
        scores = self.attend(y, feat, self.conv3x3_1(feat), out_enc, beyond)
        return self.pred_dropout(scores)[:, 1:]

    def forward_test(
        self, feat: torch.Tensor, out_enc: torch.Tensor, valid_ratio: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """Greedy decoding of ``max_text_length`` steps; probabilities (B, max_text_length, out_channels - 1).

        The input sequence starts as [holistic, start token x L]; step i reads position i and
        writes the embedding of its arg-max to position i + 1. A one-directional decoder RNN is
        causal, so its state is carried from step to step (the same values as Paddle's re-run of
        the whole sequence); a bidirectional one re-reads the whole sequence at every step.
        """
        batch = feat.shape[0]
        start = self.embedding(torch.full((batch,), self.start_idx, dtype=torch.long, device=feat.device))
        start = start.to(out_enc.dtype)
        tokens: List[torch.Tensor] = [out_enc.unsqueeze(1)] + [start.unsqueeze(1)] * self.max_seq_len
        attn_key = self.conv3x3_1(feat)
        beyond = beyond_valid_width(valid_ratio, feat.shape[3], feat.device)
        state: Optional[Tuple[torch.Tensor, ...]] = None
        fed = 0
        outputs = []
        for i in range(1, self.max_seq_len + 1):
            if self.rnn_decoder.bidirectional:
                y = self.rnn_decoder(torch.cat(tokens, dim=1))[0][:, i : i + 1]
            else:
                y, state = self.rnn_decoder(torch.cat(tokens[fed : i + 1], dim=1), state)
                y, fed = y[:, -1:], i + 1
            probs = torch.softmax(self.attend(y, feat, attn_key, out_enc, beyond)[:, 0], dim=-1)
            outputs.append(probs)
            if i < self.max_seq_len:
                tokens[i + 1] = self.embedding(probs.argmax(dim=1)).unsqueeze(1).to(out_enc.dtype)
        return torch.stack(outputs, dim=1)


@HEADS.register(name="SARHead")
class SARHead(nn.Module):
    """PaddleOCR's SARHead on a (B, in_channels, H, W) feature map.

    Training: scores (B, L, out_channels - 1) for ``batch["label_sar"]`` (B, L) (teacher forcing),
    masked by ``batch["valid_ratio"]``. Eval: probabilities (B, max_text_length, out_channels - 1),
    masked by ``batch["valid_ratio"]`` when given (else the whole width).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        enc_dim: int = 512,
        max_text_length: int = 30,
        enc_bi_rnn: bool = False,
        enc_drop_rnn: float = 0.1,
        enc_gru: bool = False,
        dec_bi_rnn: bool = False,
        dec_drop_rnn: float = 0.0,
        dec_gru: bool = False,
        d_k: int = 512,
        pred_dropout: float = 0.1,
        pred_concat: bool = True,
    ) -> None:
        super().__init__()
        check_arguments(
            in_channels=in_channels,
            enc_dim=enc_dim,
            max_text_length=max_text_length,
            d_k=d_k,
            out_channels=out_channels,
            enc_drop_rnn=enc_drop_rnn,
            dec_drop_rnn=dec_drop_rnn,
            pred_dropout=pred_dropout,
        )
        self.out_channels = out_channels
        self.encoder = SAREncoder(enc_bi_rnn, enc_drop_rnn, enc_gru, d_model=in_channels, d_enc=enc_dim)
        self.decoder = ParallelSARDecoder(
            out_channels,
            enc_bi_rnn=enc_bi_rnn,
            dec_bi_rnn=dec_bi_rnn,
            dec_drop_rnn=dec_drop_rnn,
            dec_gru=dec_gru,
            d_model=in_channels,
            d_enc=enc_dim,
            d_k=d_k,
            pred_dropout=pred_dropout,
            max_text_length=max_text_length,
            pred_concat=pred_concat,
        )
        init_like_paddle(self)

    def forward(self, feat: torch.Tensor, batch: Optional[Mapping[str, torch.Tensor]] = None) -> torch.Tensor:
        if self.training:
            missing = [key for key in ("label_sar", "valid_ratio") if batch is None or key not in batch]
            if missing:
                raise KeyError(
                    f"SARHead in training needs batch entries {missing} (the SAR label and valid "
                    "ratio: MultiLabelEncode and RecResizeImg, named in KeepKeys)"
                )
        valid_ratio = None if batch is None else batch.get("valid_ratio")
        holistic = self.encoder(feat, valid_ratio)
        if self.training:
            return self.decoder.forward_train(feat, holistic, batch["label_sar"], valid_ratio)
        return self.decoder.forward_test(feat, holistic, valid_ratio)


def check_arguments(out_channels: int, **values: float) -> None:
    """ValueError naming the first SARHead argument out of range."""
    for key in ("in_channels", "enc_dim", "max_text_length", "d_k"):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"SARHead.{key} must be a positive integer, got {value!r}")
    if isinstance(out_channels, bool) or not isinstance(out_channels, int) or out_channels < 3:
        raise ValueError(
            "SARHead.out_channels must be an integer >= 3 (characters + unknown + start + padding), "
            f"got {out_channels!r}"
        )
    for key in ("enc_drop_rnn", "dec_drop_rnn", "pred_dropout"):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"SARHead.{key} must be a probability in [0, 1), got {value!r}")


def init_like_paddle(module: nn.Module) -> None:
    """Paddle's default initialisation: Linear and Embedding weights Xavier-uniform (the padding row
    zero), biases 0; convolutions Normal(0, sqrt(2 / fan_in)); RNNs U(+-1/sqrt(hidden)) (torch's too)."""
    init_paddle_conv_default(module)
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.xavier_uniform_(m.weight)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.Embedding) and m.padding_idx is not None:
            with torch.no_grad():
                m.weight[m.padding_idx].zero_()
    for m in module.modules():
        if isinstance(m, nn.RNNBase):
            bound = 1.0 / math.sqrt(m.hidden_size)
            for param in m.parameters():
                nn.init.uniform_(param, -bound, bound)
