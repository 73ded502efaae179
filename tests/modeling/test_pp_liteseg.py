"""PP-LiteSeg: exact parameter counts of the originals, output shapes, train/eval heads."""

import pytest
import torch

import ppdist.components  # noqa: F401
from ppdist.modeling.architectures import BaseModel
from ppdist.modeling.backbones.stdcnet import STDC1, STDC2
from ppdist.modeling.heads.uafm import UAFM_ChAtten, UAFM_SpAtten

T_HEAD = {"arm_out_chs": [32, 64, 128], "seg_head_inter_chs": [32, 64, 64]}
# verified_numbers.md: PaddleSeg v2.9.1 built with paddlepaddle 2.6.2, 19 classes, 3 heads
REFERENCE = {"STDC1": 8_141_600, "STDC2": 12_366_464}


def build(backbone: str, num_classes: int = 19, **head) -> BaseModel:
    return BaseModel(
        {
            "model_type": "seg",
            "Backbone": {"name": backbone},
            "Head": dict({"name": "PPLiteSegHead", "num_classes": num_classes}, **head),
        }
    )


def trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("backbone,head", [("STDC1", T_HEAD), ("STDC2", {})])
def test_parameter_count_matches_original(backbone, head):
    model = build(backbone, **head)
    assert abs(trainable(model) - REFERENCE[backbone]) / REFERENCE[backbone] < 0.01
    assert trainable(model) == REFERENCE[backbone]  # in fact exact


@pytest.mark.parametrize("backbone,head", [("STDC1", T_HEAD), ("STDC2", {})])
def test_odd_input_sizes_train_three_logits_eval_one(backbone, head):
    torch.manual_seed(0)
    model = build(backbone, num_classes=7, **head)
    model.train()
    outs = model(torch.randn(2, 3, 250, 330))
    assert [tuple(o.shape) for o in outs] == [(2, 7, 250, 330)] * 3
    model.eval()
    with torch.no_grad():
        outs = model({"image": torch.randn(1, 3, 250, 330)})
    assert [tuple(o.shape) for o in outs] == [(1, 7, 250, 330)]


def test_backbone_feature_strides_and_channels():
    for cls in (STDC1, STDC2):
        net = cls()
        feats = net(torch.randn(1, 3, 64, 96))
        assert [f.shape[1] for f in feats] == [32, 64, 256, 512, 1024] == net.out_channels
        assert [tuple(f.shape[2:]) for f in feats] == [(32, 48), (16, 24), (8, 12), (4, 6), (2, 3)]


def test_uafm_variants_fuse_to_out_channels():
    x, y = torch.randn(2, 16, 9, 11), torch.randn(2, 24, 5, 6)
    for cls in (UAFM_SpAtten, UAFM_ChAtten):
        out = cls(16, 24, 8)(x, y)
        assert tuple(out.shape) == (2, 8, 9, 11)
    spatten = UAFM_SpAtten(16, 24, 8)
    assert "_scale" in spatten.state_dict() and all(p.requires_grad for p in spatten.parameters())


def test_channel_attention_head_builds_and_runs():
    model = build("STDC1", num_classes=3, arm_type="UAFM_ChAtten", **T_HEAD)
    # channel attention: 1x1 convs 4C -> C/2 -> C (+BN) in place of the spatial 3x3 convs 4 -> 2 -> 1
    fusion = model.head.arm_list[0]
    assert [m.conv.kernel_size for m in fusion.conv_xy_atten] == [(1, 1), (1, 1)]
    assert (
        fusion.conv_xy_atten[0].conv.in_channels == 4 * 64 and fusion.conv_xy_atten[1].conv.out_channels == 64
    )
    model.eval()
    with torch.no_grad():
        assert tuple(model(torch.randn(1, 3, 64, 64))[0].shape) == (1, 3, 64, 64)


def test_decoder_uses_paddle_default_conv_init():
    torch.manual_seed(0)
    model = build("STDC1", num_classes=19, **T_HEAD)
    conv = model.head.seg_heads[0].conv.conv  # 3x3, 32 -> 32
    expected = (2.0 / (3 * 3 * 32)) ** 0.5
    assert abs(conv.weight.std().item() - expected) / expected < 0.05
    assert model.head.cm.stages[0][1].conv.bias.abs().sum().item() == 0.0
    backbone_conv = model.backbone.features[0].conv
    assert backbone_conv.weight.std().item() < 0.002  # Normal(0, 0.001)


def test_bad_head_settings_are_reported():
    with pytest.raises(Exception, match="arm_type"):
        build("STDC1", arm_type="Nope")
    with pytest.raises(Exception, match="arm_out_chs"):
        build("STDC1", arm_out_chs=[32, 64])
