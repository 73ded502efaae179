"""CRNN (MobileNetV3 + BiLSTM + CTCHead) architecture, shapes and parameter counts."""

import copy

import pytest
import torch

from ppdist.errors import ConfigError
from ppdist.modeling import BaseModel
from ppdist.modeling.backbones.mobilenet_v3 import MobileNetV3
from ppdist.modeling.heads.ctc import CTCHead
from ppdist.modeling.layers import SEModule, hard_sigmoid_paddle, make_divisible
from ppdist.modeling.necks.rnn import SequenceEncoder


def mv3_arch(num_classes=37):
    """rec_mv3_none_bilstm_ctc.yml's Architecture, with Head.out_channels injected."""
    return {
        "model_type": "rec",
        "algorithm": "CRNN",
        "Transform": None,
        "Backbone": {"name": "MobileNetV3", "scale": 0.5, "model_name": "large"},
        "Neck": {"name": "SequenceEncoder", "encoder_type": "rnn", "hidden_size": 96},
        "Head": {"name": "CTCHead", "fc_decay": 0, "out_channels": num_classes},
    }


def lite_arch(num_classes=6625):
    """rec_chinese_lite_train_v2.0.yml's Architecture."""
    return {
        "model_type": "rec",
        "algorithm": "CRNN",
        "Transform": None,
        "Backbone": {
            "name": "MobileNetV3",
            "scale": 0.5,
            "model_name": "small",
            "small_stride": [1, 2, 2, 2],
        },
        "Neck": {"name": "SequenceEncoder", "encoder_type": "rnn", "hidden_size": 48},
        "Head": {"name": "CTCHead", "fc_decay": 0.00001, "out_channels": num_classes},
    }


def trainable(module):
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def test_mv3_parameter_count_matches_paddle():
    model = BaseModel(mv3_arch())
    total = trainable(model)
    print(f"CRNN mv3 large-0.5, 37 classes: {total:,} trainable parameters")
    assert abs(total - 1_451_787) <= 0.01 * 1_451_787
    assert total == 1_451_787
    assert trainable(model.backbone) == 778_022
    assert trainable(model.neck) == 666_624
    assert trainable(model.head) == 7_141


def test_lite_chinese_parameter_count():
    model = BaseModel(lite_arch())
    print(f"CRNN lite small-0.5, 6625 classes: {trainable(model):,} trainable parameters")
    assert trainable(model) == 1_081_377
    assert (trainable(model.backbone), trainable(model.neck), trainable(model.head)) == (
        252_896,
        185_856,
        642_625,
    )
    assert model.backbone.out_channels == 288
    assert model.neck.out_channels == 96


@pytest.mark.parametrize("width, frames", [(100, 25), (320, 80)])
def test_output_shapes(width, frames):
    model = BaseModel(mv3_arch()).eval()
    with torch.no_grad():
        assert model.backbone(torch.zeros(2, 3, 32, width)).shape == (2, 480, 1, frames)
        assert model(torch.zeros(2, 3, 32, width)).shape == (2, frames, 37)
        assert model({"image": torch.zeros(1, 3, 32, width)}).shape == (1, frames, 37)


def test_small_backbone_with_lite_strides():
    backbone = MobileNetV3(model_name="small", scale=0.5, small_stride=[1, 2, 2, 2]).eval()
    assert backbone.out_channels == 288
    with torch.no_grad():
        assert backbone(torch.zeros(1, 3, 32, 100)).shape == (1, 288, 1, 25)


def test_small_default_strides_fail_clearly_on_height_32():
    backbone = MobileNetV3(model_name="small", scale=0.5).eval()
    with pytest.raises(ValueError, match="small_stride"):
        backbone(torch.zeros(1, 3, 32, 100))


def test_make_divisible():
    assert [make_divisible(v) for v in (8, 16 * 0.5, 72 * 0.5, 120 * 0.5, 200 * 0.5, 0.35 * 16)] == [
        8,
        8,
        40,
        64,
        104,
        8,
    ]
    assert make_divisible(960 * 0.5) == 480


def test_se_gate_uses_paddle_slope():
    x = torch.linspace(-4, 4, 9)
    assert torch.allclose(hard_sigmoid_paddle(x), torch.clamp(0.2 * x + 0.5, 0, 1))
    se = SEModule(8)
    with torch.no_grad():
        se.conv2.weight.zero_()
        se.conv2.bias.fill_(1.0)  # gate = clamp(0.2 * 1 + 0.5) = 0.7 (PyTorch's slope 1/6 gives 0.667)
    feats = torch.ones(1, 8, 2, 2)
    assert torch.allclose(se(feats), torch.full_like(feats, 0.7))


def test_tuple_stride_block_has_no_shortcut():
    small = MobileNetV3(model_name="small", scale=0.5, small_stride=[1, 2, 2, 2])
    first = small.blocks[0]  # stride (1, 1), 8 -> 8 channels: still no shortcut
    assert first.bottleneck_conv.conv.stride == (1, 1)
    assert first.linear_conv.conv.in_channels == first.linear_conv.conv.out_channels == 8
    assert not first.use_shortcut
    large = MobileNetV3(model_name="large", scale=0.5)
    assert large.blocks[0].use_shortcut  # integer stride 1, 8 -> 8
    # integer stride 1 and same width: blocks 0, 2, 4, 5, 7, 8, 9, 11, 13, 14
    assert [i for i, b in enumerate(large.blocks) if b.use_shortcut] == [0, 2, 4, 5, 7, 8, 9, 11, 13, 14]


def test_softmax_only_in_eval():
    model = BaseModel(mv3_arch())
    images = torch.randn(2, 3, 32, 100)
    model.train()
    logits = model(images)
    assert not torch.allclose(logits.sum(-1), torch.ones(2, 25))
    model.eval()
    with torch.no_grad():
        probs = model(images)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 25), atol=1e-5)


def test_head_init_regularizer_and_mid_channels():
    head = CTCHead(in_channels=192, out_channels=37, fc_decay=1e-5)
    bound = 1 / 192**0.5
    for param in head.parameters():
        assert param.abs().max() <= bound
        assert param.regularizer_factor == 1e-5
    for param in copy.deepcopy(head).parameters():
        assert param.regularizer_factor == 1e-5
    stacked = CTCHead(in_channels=192, out_channels=37, mid_channels=64)
    assert trainable(stacked) == 192 * 64 + 64 + 64 * 37 + 37
    assert all(p.regularizer_factor == 0.0004 for p in stacked.parameters())
    assert stacked(torch.randn(2, 5, 192)).shape == (2, 5, 37)


def test_sequence_encoder_types():
    feats = torch.randn(2, 480, 1, 25)
    reshape = SequenceEncoder(480, encoder_type="reshape")
    assert reshape.out_channels == 480
    assert torch.equal(reshape(feats), feats[:, :, 0].transpose(1, 2))
    fc = SequenceEncoder(480, encoder_type="fc", hidden_size=64)
    assert fc.out_channels == 64 and fc(feats).shape == (2, 25, 64)
    rnn = SequenceEncoder(480, encoder_type="rnn", hidden_size=96)
    assert rnn.out_channels == 192 and rnn(feats).shape == (2, 25, 192)
    lstm = rnn.encoder.lstm
    assert lstm.num_layers == 2 and lstm.bidirectional and lstm.batch_first and lstm.dropout == 0
    with pytest.raises(ValueError, match="height|H"):
        reshape(torch.randn(2, 480, 2, 25))
    with pytest.raises(ValueError, match="encoder_type"):
        SequenceEncoder(480, encoder_type="cascadernn")
    with pytest.raises(ValueError, match="dims is a key of encoder_type svtr, not 'rnn'"):
        SequenceEncoder(480, encoder_type="rnn", dims=64)


def test_backbone_argument_validation():
    with pytest.raises(ValueError, match="model_name"):
        MobileNetV3(model_name="medium")
    with pytest.raises(ValueError, match="scale"):
        MobileNetV3(scale=0.6)
    with pytest.raises(ValueError, match="small_stride"):
        MobileNetV3(small_stride=[1, 2, 2])


def test_base_model_config_errors():
    arch = mv3_arch()
    arch["Transform"] = {"name": "TPS"}
    with pytest.raises(ConfigError, match="Transform"):
        BaseModel(arch)
    arch = mv3_arch()
    arch["Backbone"] = {"name": "MobileNetV3", "scales": 0.5}
    with pytest.raises(ConfigError, match="scale"):
        BaseModel(arch)
    arch = mv3_arch()
    arch["Neck"] = None
    model = BaseModel(arch)  # head directly on the backbone is allowed by the chaining rule
    assert model.head.fc.in_features == 480
