"""SegFormer: PaddleSeg's parameter counts for B0-B5, shapes, stochastic depth, init, config errors."""

import json
import math
import os

import pytest
import torch
from ppdist_testing import paddle_fixture_dir

import ppdist.components  # noqa: F401
from ppdist.errors import ConfigError
from ppdist.modeling.architectures import BaseModel
from ppdist.modeling.backbones.mix_transformer import MixVisionTransformer_B0
from ppdist.modeling.layers import DropPath
from ppdist.utils.host_sync import count_host_syncs

with open(os.path.join(paddle_fixture_dir("segformer"), "parameter_counts.json")) as _f:
    PADDLE_COUNTS = json.load(_f)["counts"]  # make_fixtures.py: PaddleSeg's SegFormer, 19 classes


def build(backbone="MixVisionTransformer_B0", num_classes=19, backbone_args=None, **head):
    return BaseModel(
        {
            "model_type": "seg",
            "algorithm": "SegFormer",
            "Backbone": dict({"name": backbone}, **(backbone_args or {})),
            "Head": dict({"name": "SegFormerHead", "num_classes": num_classes}, **head),
        }
    )


def trainable(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


@pytest.mark.parametrize("backbone", sorted(PADDLE_COUNTS))
def test_parameter_counts_equal_paddleseg(backbone):
    expected = PADDLE_COUNTS[backbone]
    with torch.device("meta"):  # no memory, no init cost: only the shapes count
        model = build(backbone, expected["num_classes"], embedding_dim=expected["embedding_dim"])
    assert trainable(model.backbone) == expected["backbone_trainable"]
    assert trainable(model) == expected["trainable"]


@pytest.fixture(scope="module")
def b0():
    torch.manual_seed(0)
    return build(num_classes=7, embedding_dim=32)


def test_one_logits_map_at_the_input_size_in_train_and_eval(b0):
    b0.train()
    outs = b0(torch.randn(2, 3, 50, 74))
    assert [tuple(o.shape) for o in outs] == [(2, 7, 50, 74)]
    b0.eval()
    with torch.no_grad():
        outs = b0({"image": torch.randn(1, 3, 50, 74)})
        feats = b0.backbone(torch.randn(1, 3, 50, 74))
    assert [tuple(o.shape) for o in outs] == [(1, 7, 50, 74)]
    assert [f.shape[1] for f in feats] == [32, 64, 160, 256] == b0.backbone.out_channels
    assert [tuple(f.shape[2:]) for f in feats] == [(13, 19), (7, 10), (4, 5), (2, 3)]


def test_stochastic_depth_rises_linearly_over_all_blocks():
    with torch.device("meta"):
        net = MixVisionTransformer_B0(drop_path_rate=0.35)
    blocks = [block for i in range(1, 5) for block in getattr(net, f"block{i}")]
    assert isinstance(blocks[0].drop_path, torch.nn.Identity)  # rate 0: no module, as PaddleSeg
    rates = [block.drop_path.drop_prob for block in blocks[1:]]
    assert rates == pytest.approx([0.05 * k for k in range(1, 8)], abs=1e-7)
    assert all(isinstance(block.drop_path, DropPath) for block in blocks[1:])


def test_paddleseg_initialisation(b0):
    attn = b0.backbone.block1[0].attn
    assert attn.q.weight.abs().max() <= 0.04 and abs(attn.q.weight.std().item() - 0.0176) < 0.002
    assert torch.count_nonzero(attn.q.bias) == 0
    sr = attn.sr  # 8x8 conv, 32 -> 32: fan_out 64 * 32
    assert abs(sr.weight.std().item() - math.sqrt(2.0 / (64 * 32))) < 0.002
    dw = b0.backbone.block1[0].mlp.dwconv.dwconv  # depth-wise: fan_out 9 * 128 / 128
    assert abs(dw.weight.std().item() - math.sqrt(2.0 / 9)) < 0.05
    assert torch.equal(b0.backbone.norm1.weight, torch.ones(32)) and b0.backbone.norm1.eps == 1e-6
    assert b0.backbone.patch_embed1.norm.eps == 1e-5 and attn.norm.eps == 1e-5
    proj = b0.head.linear_c4.proj  # Paddle's default Linear: Xavier uniform, bias 0
    assert proj.weight.abs().max() <= math.sqrt(6.0 / (256 + 32)) and torch.count_nonzero(proj.bias) == 0


def test_training_forward_reads_nothing_on_the_host(b0):
    b0.train()
    image = torch.randn(2, 3, 32, 40)
    counter = count_host_syncs(lambda: b0(image)[0].sum().backward())
    assert counter.count == 0, counter.report()


@pytest.mark.parametrize(
    "backbone_args,head,message",
    [
        ({"drop_path_rate": 1.5}, {}, "drop_path_rate must be a number in [0, 1), got 1.5"),
        ({}, {"embedding_dim": 0}, "embedding_dim must be a positive integer, got 0"),
        ({}, {"align_corners": "yes"}, "Head.align_corners: expected bool, got str ('yes')"),
    ],
)
def test_bad_settings_fail_with_the_key(backbone_args, head, message):
    with pytest.raises(ConfigError) as info, torch.device("meta"):
        build(backbone_args=backbone_args, **head)
    assert message in str(info.value)
    assert "Architecture." in str(info.value)
