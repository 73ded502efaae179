"""The seg heads (PP-LiteSeg, OCRNet, SegFormer) hand the loss float32 logits at the label's size:
under autocast the low-resolution logits are upcast before the upsample, and in training the
upsample's backward is the GEMM one (ppdist.ops.resize)."""

import importlib
from typing import Callable, List

import pytest
import torch
import torch.nn.functional as F

from ppdist.modeling.heads.ocrnet import OCRHead
from ppdist.modeling.heads.pp_liteseg import PPLiteSegHead
from ppdist.modeling.heads.segformer import SegFormerHead
from ppdist.ops.resize import upsample_logits

SIZE = (64, 96)
EPS = torch.finfo(torch.float32).eps


def features(channels: List[int], strides: List[int]) -> List[torch.Tensor]:
    generator = torch.Generator().manual_seed(len(channels))
    return [
        torch.randn(2, c, SIZE[0] // s, SIZE[1] // s, generator=generator) for c, s in zip(channels, strides)
    ]


HEADS = {  # name: (head, its backbone's feature maps)
    "pp_liteseg": (
        lambda: PPLiteSegHead(
            [8, 8, 16, 24, 32], 5, cm_out_ch=16, arm_out_chs=(8, 8, 16), seg_head_inter_chs=(8,) * 3
        ),
        lambda: features([8, 8, 16, 24, 32], [2, 4, 8, 16, 32]),
    ),
    "ocrnet": (
        lambda: OCRHead([12, 16], 5, [0, 1], ocr_mid_channels=16, ocr_key_channels=8, align_corners=True),
        lambda: features([12, 16], [4, 4]),
    ),
    "segformer": (
        lambda: SegFormerHead([8, 16, 24, 32], 5, embedding_dim=16),
        lambda: features([8, 16, 24, 32], [4, 8, 16, 32]),
    ),
}


def run(make_head: Callable, feats: List[torch.Tensor], autocast: bool) -> List[torch.Tensor]:
    torch.manual_seed(0)
    head = make_head().train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return head(feats, SIZE)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_training_logits_are_float32_at_the_label_size_with_a_gemm_backward(name):
    make_head, make_feats = HEADS[name]
    outputs = run(make_head, make_feats(), autocast=True)
    assert all(out.shape[-2:] == SIZE and out.dtype == torch.float32 for out in outputs)
    assert {type(out.grad_fn).__name__ for out in outputs} == {"_SeparableBilinearBackward"}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_under_autocast_the_low_resolution_logits_are_upcast_before_the_upsample(name, monkeypatch):
    make_head, make_feats = HEADS[name]
    module = importlib.import_module(f"ppdist.modeling.heads.{name}")
    low: List[torch.Tensor] = []

    def recording(logits, size, align_corners=False):
        low.append(logits.detach())
        return upsample_logits(logits, size, align_corners)

    monkeypatch.setattr(module, "upsample_logits", recording)
    outputs = run(make_head, make_feats(), autocast=True)
    align_corners = name == "ocrnet"  # as built above
    assert len(low) == len(outputs) and all(x.dtype == torch.bfloat16 for x in low)
    for out, x in zip(outputs, low):
        upcast_first = F.interpolate(x.float(), SIZE, mode="bilinear", align_corners=align_corners)
        scale = float(upcast_first.abs().max())
        torch.testing.assert_close(out.detach(), upcast_first, rtol=0, atol=4 * EPS * scale)
        bf16_upsample = F.interpolate(x, SIZE, mode="bilinear", align_corners=align_corners).float()
        assert (bf16_upsample - upcast_first).abs().max() > 1e-4 * scale  # what the bf16 upsample lost
