"""PP-OCRv3 recognition models against PaddleOCR's (fixtures in tests/fixtures/paddle_ppocrv3, written by
its make_fixtures.py with paddlepaddle 2.6.2 and PaddleOCR 2.7's own build_model).

* trainable parameter counts of ch_PP-OCRv3_rec_distillation.yml, ch_PP-OCRv3_rec.yml and
  en_PP-OCRv3_rec.yml, in total and per part (counted on the meta device: nothing is allocated);
* the full-size en_PP-OCRv3_rec.yml student with seeded weights (every layer counts, calibrated
  BatchNorm statistics): eval outputs and the train-mode head dict (dropout off, SAR teacher-forced).

Both sides compute in float64 from float32 weights (the stored outputs are float32), so the
differences are the float32 storage of the outputs: measured (torch CPU) backbone 1.1e-6 of its
largest value 32, ctc_neck 8.8e-7, probabilities 7.0e-8. The same model in float32 differs by
1.2e-4 (backbone, 3.8e-6 relative), 1.5e-4 (ctc_neck, values up to 19) and 5.3e-5 (probabilities):
float32 rounding over 20 layers, on both sides.
"""

import copy
import inspect
import json
import os

import numpy as np
import pytest
import torch
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir, paddle_fixture_script
from torch import nn

from ppdist.components import build_model, multi_head_channels
from ppdist.convert.weights import convert_state_dict
from ppdist.errors import ConfigError
from ppdist.modeling import BaseModel, DistillationModel
from ppdist.modeling.backbones import MobileNetV1Enhance
from ppdist.modeling.necks.rnn import SVTR_KEYS, SequenceEncoder
from ppdist.modeling.necks.svtr import EncoderWithSVTR
from ppdist.registry import HEADS, NECKS
from ppdist.utils.host_sync import count_host_syncs

FIXTURES = paddle_fixture_dir("ppocrv3")
FX = paddle_fixture_script("ppocrv3")
TOLERANCE = 1e-4
needs_sar = pytest.mark.skipif(
    "SARHead" not in HEADS, reason="needs SARHead (ppdist/modeling/heads/sar.py, issue 29)"
)


def load_json(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


def dictionary(tmp_path, size, name="dict.txt"):
    """A dictionary file of ``size`` distinct characters (the class count is what the models need)."""
    path = tmp_path / name
    path.write_text("".join(f"{chr(0x4E00 + i)}\n" for i in range(size)), encoding="utf-8")
    return str(path)


def model_config(arch, dictionary_path, use_space_char=True):
    return {
        "Global": {"character_dict_path": dictionary_path, "use_space_char": use_space_char},
        "Architecture": copy.deepcopy(arch),
        "PostProcess": {"name": "CTCLabelDecode"},
    }


def trainable_parts(model):
    """Trainable parameters per part, named as the fixture's (``[<model>.]backbone``, ``head.ctc_encoder``...)."""
    counts = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        parts = name.split(".")
        depth = 3 if parts[0] in ("Teacher", "Student") else 2
        key = ".".join(parts[: depth - 1] if parts[depth - 2] == "backbone" else parts[:depth])
        counts[key] = counts.get(key, 0) + param.numel()
    return counts


@needs_sar
@pytest.mark.parametrize("config", FX.CONFIGS)
def test_trainable_parameter_counts_equal_paddle(config, tmp_path):
    expected = load_json("param_counts.json")[config]
    # ppocr_keys_v1.txt has 6623 characters, en_dict.txt 95; + space + blank
    path = dictionary(tmp_path, expected["char_num"] - 2)
    with torch.device("meta"):
        model = build_model(model_config(expected["architecture"], path))
    counts = trainable_parts(model)
    print(
        f"{config}: ppdist {sum(counts.values()):,} vs Paddle {expected['trainable']:,} trainable parameters"
    )
    assert counts == expected["parts"]
    assert sum(counts.values()) == expected["trainable"]


def test_backbone_and_svtr_encoder_counts_equal_paddle():
    """The parts without the SAR head (PP-OCRv3's settings)."""
    expected = load_json("param_counts.json")["ch_PP-OCRv3_rec.yml"]["parts"]
    backbone = MobileNetV1Enhance(
        scale=0.5, last_conv_stride=[1, 2], last_pool_type="avg", last_pool_kernel_size=[2, 2]
    )
    encoder = EncoderWithSVTR(512, dims=64, depth=2, hidden_dims=120, use_guide=True)
    assert sum(p.numel() for p in backbone.parameters()) == expected["backbone"] == 1_016_160
    assert sum(p.numel() for p in encoder.parameters()) == expected["head.ctc_encoder"] == 1_192_880
    assert backbone.out_channels == 512 and encoder.out_channels == 64


@pytest.fixture(scope="module")
def en_student(tmp_path_factory):
    """ppdist's en_PP-OCRv3_rec.yml model with the fixture's weights, converted from the Paddle names."""
    manifest = load_json("en_ppocrv3.json")
    expected = paddle_fixture_arrays("ppocrv3", "en_ppocrv3")
    path = dictionary(tmp_path_factory.mktemp("ppocrv3"), manifest["char_num"] - 2)
    arch = {k: v for k, v in manifest["architecture"].items()}
    arch["Head"] = {
        k: v for k, v in arch["Head"].items() if k != "out_channels_list"
    }  # injected by build_model
    model = build_model(model_config(arch, path))
    paddle_state = FX.synthetic_state(manifest["tensors"], manifest["seed"])
    paddle_state.update({k[len("state/") :]: v for k, v in expected.items() if k.startswith("state/")})
    state, report = convert_state_dict(model, paddle_state, "en_ppocrv3")
    assert report.complete and report.unused == [], report.lines()
    model.load_state_dict(state, strict=True)
    model.double()  # as the original made the fixture: float32 values computed in float64
    for module in model.modules():  # the fixture's train-mode outputs were made with every dropout off
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(module, nn.RNNBase):
            module.dropout = 0.0
    return model, expected


def max_diff(actual, expected):
    actual = actual.detach().float().numpy() if isinstance(actual, torch.Tensor) else actual
    assert actual.shape == expected.shape
    return float(np.abs(actual - expected).max())


@needs_sar
def test_full_size_student_eval_outputs_equal_paddle(en_student):
    model, expected = en_student
    model.eval()
    image = torch.from_numpy(expected["image"]).double()
    with torch.no_grad():
        backbone_out = model.backbone(image)
        ctc_neck = model.head.ctc_encoder(backbone_out)
        probs = model({"image": image, "valid_ratio": torch.from_numpy(expected["valid_ratio"])})
    diffs = {
        "backbone_out": max_diff(backbone_out, expected["eval/backbone_out"])
        / np.abs(expected["eval/backbone_out"]).max(),
        "ctc_neck": max_diff(ctc_neck, expected["eval/ctc_neck"]),
        "probs": max_diff(probs, expected["eval/probs"]),
    }
    print("en_PP-OCRv3 eval: max abs diffs " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert all(v <= TOLERANCE for v in diffs.values()), diffs
    assert expected["eval/probs"].max(axis=2).mean() > 0.5  # peaked, varied predictions: a real check
    assert len(np.unique(expected["eval/probs"].argmax(axis=2))) > 5


@needs_sar
def test_full_size_student_train_outputs_equal_paddle(en_student):
    model, expected = en_student
    model.train()
    batch = {
        "image": torch.from_numpy(expected["image"]).double(),
        "label_sar": torch.from_numpy(expected["label_sar"]),
        "valid_ratio": torch.from_numpy(expected["valid_ratio"]),  # float32, as a loader gives it
    }
    saved = {k: v.clone() for k, v in model.state_dict().items()}  # training mode moves the BN statistics
    with torch.no_grad():
        heads = model(batch)
        backbone_out = model.backbone(batch["image"])
    model.load_state_dict(saved)
    assert set(heads) == {"ctc", "ctc_neck", "sar"}
    diffs = {key: max_diff(heads[key], expected[f"train/{key}"]) for key in ("ctc", "ctc_neck", "sar")}
    diffs["backbone_out"] = (
        max_diff(backbone_out, expected["train/backbone_out"]) / np.abs(expected["train/backbone_out"]).max()
    )
    print("en_PP-OCRv3 train: max abs diffs " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert all(v <= TOLERANCE for v in diffs.values()), diffs


# ------------------------------------------------------------------ small models: semantics, no fixture
SMALL_HEAD_LIST = [
    {
        "CTCHead": {
            "Neck": {"name": "svtr", "dims": 8, "depth": 1, "hidden_dims": 16, "use_guide": True},
            "Head": {},
        }
    },
    {"SARHead": {"enc_dim": 16, "max_text_length": 5, "d_k": 16}},
]


def small_arch(**extra):
    return {
        "model_type": "rec",
        "algorithm": "SVTR_LCNet",
        "Backbone": {
            "name": "MobileNetV1Enhance",
            "scale": 0.1,
            "last_conv_stride": [1, 2],
            "last_pool_type": "avg",
            "last_pool_kernel_size": [2, 2],
        },
        "Head": {"name": "MultiHead", "head_list": copy.deepcopy(SMALL_HEAD_LIST)},
        **extra,
    }


def small_batch(batch_size=2):
    return {
        "image": torch.randn(batch_size, 3, 48, 32),
        "label_sar": torch.full((batch_size, 5), 3, dtype=torch.long),
        "valid_ratio": torch.ones(batch_size),
    }


@needs_sar
def test_return_all_feats_and_eval_outputs(tmp_path):
    model = build_model(model_config(small_arch(return_all_feats=True), dictionary(tmp_path, 4)))
    assert model.head.ctc_head.out_channels == 6 and model.head.sar_head is not None  # 4 + space + blank
    feats = model.train()(small_batch())
    assert set(feats) == {"backbone_out", "neck_out", "head_out"}
    assert feats["neck_out"] is feats["head_out"]["ctc_neck"] and feats["backbone_out"].shape == (
        2,
        102,
        1,
        4,
    )
    assert feats["head_out"]["ctc"].shape == (2, 4, 6)
    model.eval()
    with torch.no_grad():
        out = model(small_batch())
    assert set(out) == {"head_out"} and torch.allclose(out["head_out"].sum(-1), torch.ones(2, 4))
    plain = build_model(model_config(small_arch(), dictionary(tmp_path, 4))).eval()
    with torch.no_grad():
        assert isinstance(plain(small_batch()["image"]), torch.Tensor)  # a bare tensor: batch is None


@needs_sar
def test_distillation_model_names_freezing_and_parts(tmp_path):
    student = small_arch(return_all_feats=True, pretrained=str(tmp_path / "student.pdparams"))
    teacher = small_arch(return_all_feats=True, freeze_params=True)
    arch = {
        "name": "DistillationModel",
        "model_type": "rec",
        "algorithm": "Distillation",
        "Models": {"Teacher": teacher, "Student": student},
    }
    model = build_model(model_config(arch, dictionary(tmp_path, 4)))
    assert isinstance(model, DistillationModel) and isinstance(model.Student, BaseModel)
    assert model.model_names == ["Teacher", "Student"]
    assert model.pretrained_parts == {"Student": str(tmp_path / "student.pdparams")}
    assert not any(p.requires_grad for p in model.Teacher.parameters())
    assert all(p.requires_grad for p in model.Student.parameters())
    keys = list(model.state_dict())
    assert (
        "Student.backbone.conv1._conv.weight" in keys
        and "Teacher.head.ctc_encoder.encoder.svtr_block.0.mixer.qkv.weight" in keys
    )
    out = model.train()(small_batch())
    assert set(out) == {"Teacher", "Student"} and set(out["Student"]) == {
        "backbone_out",
        "neck_out",
        "head_out",
    }
    assert model.Student.head.ctc_head.out_channels == 6  # out_channels_list injected into every model


def test_out_channels_list_is_paddles(tmp_path):
    assert multi_head_channels(6625) == {
        "CTCLabelDecode": 6625,
        "SARLabelDecode": 6627,
        "NRTRLabelDecode": 6628,
    }
    config = model_config(small_arch(), dictionary(tmp_path, 7))
    del config["PostProcess"]  # without a post-process: the dictionary's count, as CTCLabelDecode's
    model = build_model(config)
    assert model.head.ctc_head.out_channels == 9  # 7 + space + blank


def test_svtr_use_guide_stops_gradients_into_the_backbone():
    torch.manual_seed(0)
    x = torch.randn(1, 16, 1, 6, requires_grad=True)
    guided = EncoderWithSVTR(16, dims=8, depth=1, hidden_dims=8, num_heads=2, use_guide=True)
    guided(x).sum().backward()
    assert x.grad is None
    free = EncoderWithSVTR(16, dims=8, depth=1, hidden_dims=8, num_heads=2, use_guide=False)
    free(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "head_list, message",
    [
        ([{"CTCHead": {"Neck": {"name": "svtr"}, "Head": {}}}], "needs a CTCHead and a SARHead"),
        (
            [{"CTCHead": {"Neck": {"name": "svtr"}}}, {"NRTRHead": {"nrtr_dim": 64}}],
            r"head_list\[1\]: NRTRHead .* not supported yet",
        ),
        (
            [{"CTCHead": {"Neck": {"name": "svtr", "dimz": 8}}}, {"SARHead": {}}],
            r"unknown key MultiHead.head_list\[0\].CTCHead.Neck.dimz for neck 'SequenceEncoder'.*'dims'",
        ),
        ([{"CTCHead": {"Head": {}}}, {"SARHead": {}}], r"head_list\[0\].CTCHead needs Neck"),
        ([{"CTCHead": {"Neck": {"name": "svtr"}, "Head": {"fc_dacay": 1}}}, {"SARHead": {}}], "fc_dacay"),
    ],
)
def test_multi_head_config_errors_are_one_line(head_list, message, tmp_path):
    arch = small_arch()
    arch["Head"]["head_list"] = head_list
    with pytest.raises(ConfigError, match=message) as info:
        build_model(model_config(arch, dictionary(tmp_path, 4)))
    assert "\n" not in str(info.value) and str(info.value).startswith("Architecture.Head (MultiHead)")


def test_backbone_argument_errors():
    with pytest.raises(ValueError, match="last_pool_type must be one of"):
        MobileNetV1Enhance(last_pool_type="min")
    with pytest.raises(ValueError, match=r"last_conv_stride must be a positive int or \[height, width\]"):
        MobileNetV1Enhance(last_conv_stride=[1, 2, 3])
    max_pool = MobileNetV1Enhance(scale=0.1)  # Paddle's default: a 2x2 max pooling
    assert max_pool(torch.zeros(1, 3, 32, 64)).shape == (1, 102, 1, 16)


def test_training_forward_and_backward_read_nothing_on_the_host(tmp_path):
    """The GPU never waits: a training step of a PP-OCRv3 model (backbone, svtr, MultiHead, SAR) reads no
    device value on the host (``ppdist.utils.host_sync`` counts them on CPU too)."""
    arch = {
        "name": "DistillationModel",
        "model_type": "rec",
        "Models": {"Student": small_arch(return_all_feats=True)},
    }
    model = build_model(model_config(arch, dictionary(tmp_path, 4))).train()
    batch = small_batch(batch_size=1)

    def step():
        out = model(batch)["Student"]
        (
            out["head_out"]["ctc"].mean() + out["head_out"]["sar"].mean() + out["backbone_out"].mean()
        ).backward()

    counter = count_host_syncs(step)
    assert counter.count == 0, counter.report()


def test_sequence_encoder_names_every_svtr_key():
    """SequenceEncoder names svtr's settings so that config validation checks them before any build."""
    own = set(inspect.signature(SequenceEncoder).parameters) - {"in_channels", "encoder_type", "hidden_size"}
    assert own == set(SVTR_KEYS) == set(inspect.signature(EncoderWithSVTR).parameters) - {"in_channels"}
    with pytest.raises(ConfigError, match=r"unknown key Architecture.Neck.hiden_dims .*'hidden_dims'"):
        NECKS.check("SequenceEncoder", {"encoder_type": "svtr", "hiden_dims": 8}, "Architecture.Neck")
