"""SLAHead, SLANet's table structure and cell box decoder (PaddleOCR's ``table_att_head.SLAHead``).

The head attends over the last (coarsest) feature map of the neck, flattened to (B, H*W, C). At
each step an attention GRU cell reads the previous token as a one-hot vector and the attention
context; its output feeds the structure generator (Linear -> Linear: token scores) and the
location generator (Linear -> Linear -> sigmoid: ``loc_reg_num`` normalised box coordinates).

Training (teacher forcing): step i reads ``batch["structure"][:, i]`` for i = 0..max_text_length;
the structure output is the generator's scores (logits, as the original). Eval: greedy decoding of
``max_text_length + 1`` steps starting from token 0 (``sos``), each step reading the arg-max of the
previous one; the structure output is the softmax of the scores. Both return ``{"structure_probs":
(B, max_text_length + 1, out_channels), "loc_preds": (B, max_text_length + 1, loc_reg_num)}``.

The eval decode is ``GreedyDecoder``, a module over the head's own layers written so that
``torch.jit.script`` keeps its steps as one loop (``ppdist.export`` scripts it: the ONNX graph holds
one ``Loop`` node, not ``max_text_length + 1`` copies of a step).

Attribute names are PaddleOCR's (``structure_attention_cell.{i2h, h2h, score, rnn}``,
``structure_generator.{0, 1}``, ``loc_generator.{0, 1}``), so state-dict keys are Paddle's.
Nothing in either forward reads a device value on the host (the one-hot is a comparison).
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ppdist.modeling.deferred_grad import Stash, step_linear, step_read, tap
from ppdist.modeling.gru_gates import gru_from_gates
from ppdist.modeling.layers import L2TaggedModule
from ppdist.registry import HEADS


def one_hot(tokens: torch.Tensor, classes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(...) int tokens -> (..., n) one-hot in ``dtype`` (``classes`` is ``arange(n)``); no host read,
    unlike ``F.one_hot``'s range check; a token outside [0, n) gives a zero row."""
    return (tokens.unsqueeze(-1) == classes).to(dtype)


def gru_cell(inputs: torch.Tensor, hidden: torch.Tensor, rnn: nn.GRUCell) -> torch.Tensor:
    """``rnn(inputs, hidden)`` in elementary operations, as ATen computes it (gates r, z, n)."""
    gates_i = torch.nn.functional.linear(inputs, rnn.weight_ih, rnn.bias_ih).chunk(3, 1)
    gates_h = torch.nn.functional.linear(hidden, rnn.weight_hh, rnn.bias_hh).chunk(3, 1)
    reset = torch.sigmoid(gates_i[0] + gates_h[0])
    update = torch.sigmoid(gates_i[1] + gates_h[1])
    new = torch.tanh(gates_i[2] + reset * gates_h[2])
    return (hidden - new) * update + new


class AttentionGRUCell(nn.Module):
    """Additive attention over ``feats`` (B, T, C) from the previous hidden state, then a GRU cell
    on [context, previous token one-hot]."""

    def __init__(self, input_size: int, hidden_size: int, num_embeddings: int) -> None:
        super().__init__()
        self.i2h = nn.Linear(input_size, hidden_size, bias=False)
        self.h2h = nn.Linear(hidden_size, hidden_size)
        self.score = nn.Linear(hidden_size, 1, bias=False)
        self.rnn = nn.GRUCell(input_size + num_embeddings, hidden_size)
        self.hidden_size = hidden_size

    def forward(
        self, hidden: torch.Tensor, feats: torch.Tensor, feats_proj: torch.Tensor, token: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """One step: (the new hidden state (B, hidden), attention weights (B, T)).

        ``feats_proj`` is ``i2h(feats)``, the same at every step (computed once by the caller).
        """
        energy = torch.tanh(feats_proj + self.h2h(hidden).unsqueeze(1))
        alpha = torch.softmax(self.score(energy), dim=1)  # (B, T, 1)
        context = torch.bmm(alpha.transpose(1, 2), feats).squeeze(1)
        inputs = torch.cat((context, token.to(context.dtype)), dim=1)
        if torch.jit.is_scripting():  # the exported decode: GRUCell's own checks and op do not export to ONNX
            hidden = gru_cell(inputs, hidden.to(context.dtype), self.rnn)
        else:
            hidden = self.rnn(inputs, hidden.to(context.dtype))
        return hidden, alpha.squeeze(2)


def _positive_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"SLAHead.{key} must be a positive integer, got {value!r}")
    return value


@HEADS.register(name="SLAHead")
class SLAHead(L2TaggedModule):
    """(B, C, H, W) maps (the last one is used) -> structure scores/probabilities and cell boxes.

    ``out_channels``: the structure dictionary's tokens (merged ``<td></td>``, ``sos``, ``eos``),
    filled from the post-process by ``build_model``. ``fc_decay`` > 0 gives the generators' Linear
    parameters that L2 coefficient and PaddleOCR's U(+-1/sqrt(hidden_size)) init.
    """

    def __init__(
        self,
        in_channels: Union[int, Sequence[int]],
        hidden_size: int,
        out_channels: int = 30,
        max_text_length: int = 500,
        loc_reg_num: int = 4,
        fc_decay: float = 0.0,
    ) -> None:
        super().__init__()
        channels = in_channels if isinstance(in_channels, int) else list(in_channels)[-1]
        _positive_int("in_channels", channels)
        self.hidden_size = _positive_int("hidden_size", hidden_size)
        self.max_text_length = _positive_int("max_text_length", max_text_length)
        self.loc_reg_num = _positive_int("loc_reg_num", loc_reg_num)
        self.num_embeddings = _positive_int("out_channels", out_channels)
        if isinstance(fc_decay, bool) or not isinstance(fc_decay, (int, float)) or fc_decay < 0:
            raise ValueError(f"SLAHead.fc_decay must be a number >= 0, got {fc_decay!r}")
        self.out_channels = out_channels
        self.structure_attention_cell = AttentionGRUCell(channels, hidden_size, out_channels)
        self.structure_generator = nn.Sequential(
            nn.Linear(hidden_size, hidden_size), nn.Linear(hidden_size, out_channels)
        )
        self.loc_generator = nn.Sequential(
            nn.Linear(hidden_size, hidden_size), nn.Linear(hidden_size, loc_reg_num), nn.Sigmoid()
        )
        self.register_buffer("classes", torch.arange(out_channels), persistent=False)
        self._init_like_paddle(float(fc_decay))

    def _init_like_paddle(self, fc_decay: float) -> None:
        """Paddle's defaults: Linear weights Xavier-uniform, biases 0, the GRU cell U(+-1/sqrt(hidden))
        (torch's default too); with ``fc_decay`` the generators' Linears U(+-1/sqrt(hidden_size))."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        generators = [*self.structure_generator.parameters(), *self.loc_generator.parameters()]
        if fc_decay > 0:
            bound = 1.0 / math.sqrt(self.hidden_size)
            for param in generators:
                nn.init.uniform_(param, -bound, bound)
        self.regularizer_factor = fc_decay
        self.tag_parameters()

    def tag_parameters(self) -> None:
        """Only the generators carry ``fc_decay`` (the others follow the optimizer's regularizer)."""
        if self.regularizer_factor > 0:
            for param in [*self.structure_generator.parameters(), *self.loc_generator.parameters()]:
                param.regularizer_factor = float(self.regularizer_factor)

    def forward(
        self,
        feats: Union[torch.Tensor, Sequence[torch.Tensor]],
        batch: Optional[Mapping[str, torch.Tensor]] = None,
    ) -> Dict[str, torch.Tensor]:
        fea = self.flat_features(feats)
        if self.training:
            if batch is None or "structure" not in batch:
                raise KeyError(
                    "SLAHead in training needs the batch entry 'structure' (TableLabelEncode's token "
                    "indices, named in KeepKeys)"
                )
            return self._forward_teacher(fea, batch["structure"])
        structure, locs = self.decoder()(fea)
        return {"structure_probs": structure, "loc_preds": locs}

    def flat_features(self, feats: Union[torch.Tensor, Sequence[torch.Tensor]]) -> torch.Tensor:
        """The last map of ``feats`` flattened to (B, H*W, C), what the attention reads."""
        fea = feats if isinstance(feats, torch.Tensor) else feats[-1]
        return fea.flatten(2).transpose(1, 2)

    def decoder(self) -> "GreedyDecoder":
        """The eval decode over this head's layers (shared, not copied)."""
        return GreedyDecoder(self)

    def _forward_teacher(self, fea: torch.Tensor, structure: torch.Tensor) -> Dict[str, torch.Tensor]:
        steps = self.max_text_length + 1
        if structure.dim() != 2 or structure.shape[1] < steps:
            raise ValueError(
                f"SLAHead: batch['structure'] must be (B, >= max_text_length + 1 = {steps}) token "
                f"indices, got shape {tuple(structure.shape)}"
            )
        tokens = one_hot(
            structure[:, :steps].to(self.classes.device, non_blocking=True), self.classes, fea.dtype
        )
        output = self._teacher_steps(fea, tokens)  # (B, steps, hidden)
        return {"structure_probs": self.structure_generator(output), "loc_preds": self.loc_generator(output)}

    def _teacher_steps(self, fea: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The hidden states (B, steps, hidden) of the teacher-forced steps: ``AttentionGRUCell``
        step by step with its algebra rearranged for fewer kernels per step. Before the loop: the
        attention's ``i2h(fea)``, and the token part of the GRU's input gates for every step (one
        GEMM; ``W_ih`` splits into a context and a token block). In the loop the previous hidden
        state is read by one GEMM for both ``h2h`` and the GRU's ``W_hh``. The gradients of the
        weights the steps share (that GEMM's, ``W_ih``'s context block) and of ``fea`` through the
        attention reads are summed once after the loop (``ppdist.modeling.deferred_grad``)."""
        cell = self.structure_attention_cell
        size = self.hidden_size
        fea_proj = cell.i2h(fea)
        w_context, w_token = cell.rnn.weight_ih.split([fea.shape[2], tokens.shape[2]], 1)
        token_gates = torch.nn.functional.linear(tokens, w_token, cell.rnn.bias_ih).unbind(1)
        hidden_stash, context_stash, read_stash = Stash("linear", bias=True), Stash("linear"), Stash("read")
        w_hidden, b_hidden = tap(
            hidden_stash,
            torch.cat((cell.h2h.weight, cell.rnn.weight_hh)),
            torch.cat((cell.h2h.bias, cell.rnn.bias_hh)),
        )
        (w_context,) = tap(context_stash, w_context)
        (fea_read,) = tap(read_stash, fea)
        hidden = fea.new_zeros((fea.shape[0], size))
        outputs = []
        for gates_token in token_gates:
            attention, gates_h = step_linear(hidden, w_hidden, b_hidden, hidden_stash).split(
                [size, 3 * size], 1
            )
            energy = torch.tanh(fea_proj + attention.unsqueeze(1))
            alpha = torch.softmax(cell.score(energy), dim=1)  # (B, T, 1)
            context = step_read(alpha, fea_read, read_stash)
            gates_i = step_linear(context, w_context, gates_token, context_stash, per_step=True)
            hidden = gru_from_gates(gates_i, gates_h, hidden)
            outputs.append(hidden)
        return torch.stack(outputs, dim=1)


class GreedyDecoder(nn.Module):
    """SLAHead's eval decode: ``max_text_length + 1`` greedy steps from token 0 (``sos``), each
    reading the arg-max of the previous one. ``forward(fea (B, T, C)) -> (softmax of the structure
    scores (B, L, classes), boxes (B, L, loc_reg_num))``.

    Written for ``torch.jit.script``: a ``while`` loop, which neither ``torch.jit.freeze`` nor the
    ONNX exporter unrolls (they unroll a ``for`` over a constant range into L copies of the step),
    so the exported graph holds one loop whatever ``max_text_length``. Its layers are the head's.
    """

    def __init__(self, head: SLAHead) -> None:
        super().__init__()
        self.cell = head.structure_attention_cell
        self.structure_generator = head.structure_generator
        self.loc_generator = head.loc_generator
        self.register_buffer("classes", head.classes, persistent=False)
        self.hidden_size = head.hidden_size
        self.steps = head.max_text_length + 1

    def forward(self, fea: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        fea_proj = self.cell.i2h(fea)
        hidden = fea.new_zeros((fea.shape[0], self.hidden_size))
        sos = fea.new_zeros((fea.shape[0],), dtype=torch.long)
        token = one_hot(sos, self.classes, fea.dtype)
        scores: List[torch.Tensor] = []
        locs: List[torch.Tensor] = []
        step = 0
        while step < self.steps:
            hidden, _ = self.cell(hidden, fea, fea_proj, token)
            step_scores = self.structure_generator(hidden)
            scores.append(step_scores)
            locs.append(self.loc_generator(hidden))
            token = one_hot(step_scores.argmax(dim=1), self.classes, fea.dtype)
            step += 1
        return torch.softmax(torch.stack(scores, dim=1).float(), dim=-1), torch.stack(locs, dim=1)
