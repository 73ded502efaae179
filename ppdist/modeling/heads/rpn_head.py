"""RPNHead: Faster R-CNN's region proposal network (PaddleDetection semantics and parameter
names: ``rpn_feat.rpn_conv``, ``rpn_rois_score``, ``rpn_rois_delta``), shared by every FPN level.

``forward(feats, im_shape)`` returns, in training and in evaluation::

    {"rois": [B, N, 4], "rois_score": [B, N], "rois_mask": [B, N] bool,    # proposals, detached
     "rpn_scores": [B, A], "rpn_deltas": [B, A, 4], "anchors": [A, 4]}      # what the RPN loss takes

``rpn_scores`` (objectness logits) and ``rpn_deltas`` cover all levels' anchors in ``anchors``'
order; the RPN loss (its anchor targets: ``rpn_target_assign``, kept here for it as
``self.rpn_target_assign``) consumes them. Proposals use ``train_proposal`` in training and
``test_proposal`` otherwise.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ppdist.modeling.heads.anchor_generator import AnchorGenerator
from ppdist.modeling.heads.proposal_generator import ProposalGenerator, flatten_level
from ppdist.modeling.heads.settings import checked_settings
from ppdist.registry import HEADS

# PaddleDetection's RPNHead defaults (ProposalGenerator's own for test; 12000 / 2000 for training)
DEFAULT_TRAIN_PROPOSAL = {"pre_nms_top_n": 12000, "post_nms_top_n": 2000}
DEFAULT_RPN_TARGET_ASSIGN = {
    "batch_size_per_im": 256,
    "fg_fraction": 0.5,
    "positive_overlap": 0.7,
    "negative_overlap": 0.3,
    "use_random": True,
}


def _conv(in_channel: int, out_channel: int, kernel: int) -> nn.Conv2d:
    """A conv with Paddle's RPN init: weights Normal(0, 0.01), bias 0."""
    conv = nn.Conv2d(in_channel, out_channel, kernel, padding=kernel // 2)
    nn.init.normal_(conv.weight, 0.0, 0.01)
    nn.init.zeros_(conv.bias)
    return conv


class RPNFeat(nn.Module):
    """The shared 3x3 conv + ReLU of every level."""

    def __init__(self, in_channel: int = 1024, out_channel: int = 1024) -> None:
        super().__init__()
        self.rpn_conv = _conv(in_channel, out_channel, 3)

    def forward(self, feats: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        return [F.relu(self.rpn_conv(feat)) for feat in feats]


@HEADS.register
class RPNHead(nn.Module):
    """Objectness logits and box deltas per anchor and level, anchors, and the proposals."""

    def __init__(
        self,
        anchor_generator: Optional[Mapping[str, Any]] = None,
        rpn_target_assign: Optional[Mapping[str, Any]] = None,
        train_proposal: Optional[Mapping[str, Any]] = None,
        test_proposal: Optional[Mapping[str, Any]] = None,
        in_channel: int = 1024,
        export_onnx: bool = False,
        loss_rpn_bbox: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__()
        if export_onnx:
            raise ValueError("RPNHead: export_onnx is Paddle's ONNX path; ppdist exports its own graph")
        if loss_rpn_bbox is not None:
            raise ValueError("RPNHead: loss_rpn_bbox is not supported (the RPN box loss is L1)")
        self.anchor_generator = AnchorGenerator(
            **checked_settings(AnchorGenerator, anchor_generator, "RPNHead.anchor_generator")
        )
        self.rpn_target_assign = dict(DEFAULT_RPN_TARGET_ASSIGN, **dict(rpn_target_assign or {}))
        train = checked_settings(ProposalGenerator, train_proposal, "RPNHead.train_proposal")
        self.train_proposal = ProposalGenerator(**dict(DEFAULT_TRAIN_PROPOSAL, **train))
        self.test_proposal = ProposalGenerator(
            **checked_settings(ProposalGenerator, test_proposal, "RPNHead.test_proposal")
        )
        num_anchors = self.anchor_generator.num_anchors
        self.in_channel = in_channel
        self.out_channels = in_channel
        self.rpn_feat = RPNFeat(in_channel, in_channel)
        self.rpn_rois_score = _conv(in_channel, num_anchors, 1)
        self.rpn_rois_delta = _conv(in_channel, 4 * num_anchors, 1)

    def forward(self, feats: Sequence[torch.Tensor], im_shape: torch.Tensor) -> Dict[str, torch.Tensor]:
        rpn_feats = self.rpn_feat(feats)
        scores = [self.rpn_rois_score(f) for f in rpn_feats]
        deltas = [self.rpn_rois_delta(f) for f in rpn_feats]
        anchors = self.anchor_generator(rpn_feats)
        generate = self.train_proposal if self.training else self.test_proposal
        out = generate(scores, deltas, anchors, im_shape)
        flat = [flatten_level(s, d) for s, d in zip(scores, deltas)]
        out["rpn_scores"] = torch.cat([s for s, _ in flat], dim=1)
        out["rpn_deltas"] = torch.cat([d for _, d in flat], dim=1)
        out["anchors"] = torch.cat(anchors)
        return out
