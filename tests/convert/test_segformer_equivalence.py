"""PaddleSeg SegFormer-B0 weights -> ppdist: complete conversion and the original's outputs.

The fixture (tests/fixtures/paddle_segformer, written by its make_fixtures.py with paddlepaddle
2.6.2 and PaddleSeg's own ``SegFormer`` / ``MixVisionTransformer_B0``) is the real-size B0 of
``segformer_b0_cityscapes_*`` (19 classes, embedding_dim 256) with seeded weights re-created here
from its manifest (Paddle names, Paddle layouts: Linear weights ``[in, out]``), and holds the
original's backbone maps and logits in eval mode (1x3x72x104) and in train mode with stochastic
depth and dropout off (2x3x40x56, BatchNorm on batch statistics). Measured max abs differences
(torch 2.14 CPU, float32; ``pytest -s`` prints them): backbone maps 6.4e-6, eval logits 6.9e-6,
train-mode logits 7.9e-6; Paddle's own float32 logits are 6.2e-6 from its float64 ones. No Paddle
is needed.
"""

import json
import os

import numpy as np
import pytest
import torch
from ppdist_testing import paddle_fixture_arrays, paddle_fixture_dir, paddle_fixture_script

import ppdist.components  # noqa: F401
from ppdist.convert.weights import convert_state_dict
from ppdist.modeling.architectures import BaseModel
from ppdist.modeling.layers import DropPath

FX = paddle_fixture_script("segformer")
TOLERANCE = 1e-4


def build():
    with open(os.path.join(paddle_fixture_dir("segformer"), "segformer_b0.json")) as f:
        manifest = json.load(f)
    model = BaseModel(
        {
            "model_type": "seg",
            "algorithm": "SegFormer",
            "Backbone": {
                "name": "MixVisionTransformer_B0",
            },
            "Head": {
                "name": "SegFormerHead",
                "num_classes": manifest["num_classes"],
                "embedding_dim": manifest["embedding_dim"],
            },
        }
    )
    return model, manifest


@pytest.fixture(scope="module")
def fixture():
    """(model with the converted weights, the conversion report, the Paddle state, the reference arrays)."""
    model, manifest = build()
    reference = paddle_fixture_arrays("segformer", "segformer_b0")
    state = FX.synthetic_state(manifest["tensors"], manifest["seed"])
    for key in list(reference):
        if key.startswith("state/"):
            state[key[len("state/") :]] = reference.pop(key)
    converted, report = convert_state_dict(model, state, "segformer_b0")
    model.load_state_dict(converted)
    return model, report, state, reference


def test_every_tensor_converts_with_paddle_names(fixture):
    model, report, state, _ = fixture
    assert (report.missing, report.skipped, report.unused) == ([], [], [])
    assert report.total == len(model.state_dict()) - 1 == len(state)  # num_batches_tracked is not Paddle's
    q = state["backbone.block1.0.attn.q.weight"]  # Paddle Linear [in, out]
    assert torch.equal(model.backbone.block1[0].attn.q.weight, torch.from_numpy(q).t())
    fuse = state["linear_fuse._batch_norm._variance"]
    assert torch.equal(model.head.linear_fuse.bn.running_var, torch.from_numpy(fuse))
    assert torch.equal(model.head.linear_c4.proj.weight, torch.from_numpy(state["linear_c4.proj.weight"]).t())


def test_eval_outputs_equal_paddle(fixture):
    model, _, _, reference = fixture
    image, _ = FX.inputs(FX.B0["seed"])
    model.eval()
    captured = []
    hook = model.backbone.register_forward_hook(lambda module, args, out: captured.extend(out))
    with torch.no_grad():
        logits = model(torch.from_numpy(image))
    hook.remove()
    feats = captured
    assert len(logits) == 1
    for i, feat in enumerate(feats):
        diff = (feat - torch.from_numpy(reference[f"feat_{i}"])).abs().max().item()
        print(f"SegFormer-B0 backbone map {i} {tuple(feat.shape)}: max abs diff {diff:.1e}")
        assert diff <= TOLERANCE
    diff = (logits[0] - torch.from_numpy(reference["logits"])).abs().max().item()
    print(f"SegFormer-B0 eval logits {tuple(logits[0].shape)}: max abs diff {diff:.1e}")
    assert logits[0].shape == (1, 19, 72, 104)
    assert diff <= TOLERANCE


def test_train_mode_outputs_equal_paddle_without_drop_path_and_dropout(fixture):
    model, _, _, reference = fixture
    drop_paths = [m for m in model.modules() if isinstance(m, DropPath)]
    assert len(drop_paths) == 7  # B0: 8 blocks, the first one's rate is 0
    for module in drop_paths:  # PaddleSeg's reset_drop_path(0.0)
        module.drop_prob = 0.0
    model.train()
    model.head.dropout.eval()
    _, train_image = FX.inputs(FX.B0["seed"])
    with torch.no_grad():
        logits = model(torch.from_numpy(train_image))
    diff = (logits[0] - torch.from_numpy(reference["train_logits"])).abs().max().item()
    print(f"SegFormer-B0 train-mode logits {tuple(logits[0].shape)}: max abs diff {diff:.1e}")
    assert logits[0].shape == (2, 19, 40, 56)
    assert diff <= TOLERANCE
    # the batch's statistics were used, not the (different) running ones
    model.eval()
    with torch.no_grad():
        assert (model(torch.from_numpy(train_image))[0] - logits[0]).abs().max().item() > 0.1


def test_imagenet_backbone_file_layout_converts_into_the_backbone(fixture):
    """``mix_vision_transformer_b*.pdparams``: the backbone's keys without ``backbone.`` (+ a classifier)."""
    model, _, state, _ = fixture
    backbone_only = {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}
    backbone_only["head.weight"] = np.zeros((256, 1000), np.float32)  # ImageNet classifier: not used
    converted, report = convert_state_dict(
        model, backbone_only, "mix_vision_transformer_b0", stage="backbone"
    )
    assert (report.missing, report.skipped) == ([], [])
    assert report.unused == ["head.weight"]
    own = model.backbone.state_dict()
    assert converted.keys() == own.keys()
    assert all(torch.equal(converted[k], own[k]) for k in own)
