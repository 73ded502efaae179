"""ResNet / ResNeXt + FPN equal PaddleDetection's: outputs for the same weights, trainable
parameters (freeze_at, freeze_norm), Paddle names converting with and without ``backbone.``.

The fixtures (tests/fixtures/faster_rcnn/<name>.npz, written by make_backbone.py with paddlepaddle
2.6.2 and PaddleDetection release/2.7.1's own ResNet and FPN) hold the eval-mode outputs for
weights the script's ``synthetic_state`` makes from each Paddle name; the test makes the same state
dict, converts it with ppdist's weights converter and compares. Measured max abs errors (maps of
magnitude 0.5-5): ResNet-50-vd + FPN 7.7e-7 / 2.0e-6, ResNet-34 + FPN 2.1e-6 / 3.5e-6,
ResNeXt-101-vd 64x4d + FPN 1.9e-6 / 3.0e-6, ResNet-50 C4 1.3e-6, ResNet-34-vd (freeze_at 1,
trainable norms, 3 levels) 6.6e-7 / 8.3e-7, ResNet-50-vd on a 36x60 input (odd maps: the vd
shortcut's ceil-mode pool over partial windows; floor mode fails) 8.3e-7; tolerance 1e-4.
"""

import importlib.util
import json
import os

import numpy as np
import pytest
import torch

from ppdist.convert.weights import convert_state_dict
from ppdist.errors import ConfigError
from ppdist.modeling.architectures import BaseModel
from ppdist.modeling.backbones.resnet import ResNet
from ppdist.modeling.necks.fpn import FPN
from ppdist.optim import build_optimizer
from ppdist.utils.host_sync import HostSyncCounter

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "fixtures", "faster_rcnn")
TOL = 1e-4


def _script():
    spec = importlib.util.spec_from_file_location("make_backbone", os.path.join(FIXTURES, "make_backbone.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FX = _script()


def fixture(name):
    with np.load(os.path.join(FIXTURES, f"{name}.npz")) as data:
        arrays = {key: data[key] for key in data.files}
    meta = json.loads(str(arrays.pop("meta")))
    return arrays, meta


def ppdist_model(name):
    kwargs, out_channel = FX.FIXTURES[name]
    arch = {"model_type": "det", "Backbone": {"name": "ResNet", **kwargs}}
    if out_channel is not None:
        strides = [4 * 2**i for i in kwargs["return_idx"]]
        arch["Neck"] = {"name": "FPN", "out_channel": out_channel, "spatial_scales": [1 / s for s in strides]}
    return BaseModel(arch)


@pytest.mark.parametrize("name", list(FX.FIXTURES))
def test_outputs_and_trainable_parameters_equal_paddledetection(name):
    arrays, meta = fixture(name)
    shapes = dict(zip(meta["keys"], [tuple(s) for s in meta["shapes"]]))
    model = ppdist_model(name)
    state, report = convert_state_dict(model, FX.synthetic_state(shapes), "fixture")
    assert report.complete and not report.unused, report.lines()
    model.load_state_dict(state)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(meta["trainable"])
    x = torch.from_numpy(arrays["image"])
    model.eval()
    with torch.no_grad():
        feats = model.backbone(x)
        outs = model(x)
    for i, feat in enumerate(feats):
        np.testing.assert_allclose(feat.numpy(), arrays[f"c{i}"], rtol=0, atol=TOL)
    if model.neck is not None:
        assert len(outs) == len([k for k in arrays if k.startswith("p")])
        for i, out in enumerate(outs):
            np.testing.assert_allclose(out.numpy(), arrays[f"p{i}"], rtol=0, atol=TOL)
    if FX.FIXTURES[name][0].get("freeze_norm", True):  # frozen norms: training mode computes the same
        model.train()
        with torch.no_grad():
            for i, feat in enumerate(model.backbone(x)):
                np.testing.assert_allclose(feat.numpy(), arrays[f"c{i}"], rtol=0, atol=TOL)


def test_imagenet_layout_converts_into_the_backbone():
    """An ImageNet backbone file (keys without ``backbone.``) fills the backbone stage with the
    values the whole-model layout gives."""
    _, meta = fixture("resnet34_fpn")
    shapes = {k: tuple(s) for k, s in zip(meta["keys"], meta["shapes"]) if k.startswith("backbone.")}
    whole = FX.synthetic_state(shapes)
    model = ppdist_model("resnet34_fpn")
    state, _ = convert_state_dict(model, whole, "model zoo")
    plain = {k[len("backbone.") :]: v for k, v in whole.items()}
    backbone_state, report = convert_state_dict(model, plain, "imagenet", stage="backbone")
    assert report.complete and not report.unused, report.lines()
    for key, value in backbone_state.items():
        torch.testing.assert_close(value, state[f"backbone.{key}"], rtol=0, atol=0)


def test_freeze_norm_keeps_statistics_and_affine_fixed():
    model = ResNet(depth=18, freeze_at=-1, freeze_norm=True)
    norm = model.res2.res2a.branch2a.norm
    before = norm.running_mean.clone()
    model.train()
    model(torch.randn(2, 3, 32, 32)).__len__()
    assert torch.equal(norm.running_mean, before) and not norm.training
    assert not norm.weight.requires_grad and model.res2.res2a.branch2a.conv.weight.requires_grad
    trainable = ResNet(depth=18, freeze_at=-1, freeze_norm=False)
    trainable.train()
    trainable(torch.randn(2, 3, 32, 32))
    assert not torch.equal(trainable.res2.res2a.branch2a.norm.running_mean, before)


def test_freeze_at_and_stem_only():
    frozen = ResNet(depth=18, freeze_at=1)
    assert not any(p.requires_grad for p in frozen.conv1.parameters())
    assert not any(p.requires_grad for p in frozen.res3.parameters())
    assert frozen.res4.res4a.branch2a.conv.weight.requires_grad
    stem = ResNet(depth=18, freeze_at=2, freeze_stem_only=True)
    assert (
        not stem.conv1.conv1.conv.weight.requires_grad and stem.res2.res2a.branch2a.conv.weight.requires_grad
    )


def test_lr_mult_list_reaches_the_optimizer():
    """The SSLD configs' per-stage rates: conv weights of res2..res5 get their stage's multiplier."""
    model = ResNet(depth=18, freeze_at=-1, lr_mult_list=[0.05, 0.05, 0.1, 0.15])
    optimizer, scheduler = build_optimizer(
        {"name": "Momentum", "momentum": 0.9, "lr": {"name": "Const", "learning_rate": 0.01}}, model, 1, 10
    )
    rates = {name: group["lr"] for group in optimizer.param_groups for name in group["names"]}
    assert rates["conv1.conv1.conv.weight"] == pytest.approx(0.01)
    assert rates["res2.res2a.branch2a.conv.weight"] == pytest.approx(0.0005)
    assert rates["res5.res5b.branch2b.conv.weight"] == pytest.approx(0.0015)


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"norm_type": "sync_bn"}, "norm_type"),
        ({"dcn_v2_stages": [1, 2, 3]}, "dcn_v2_stages"),
        ({"std_senet": True}, "std_senet"),
        ({"depth": 26}, "depth"),
        ({"variant": "e"}, "variant"),
        ({"return_idx": [3], "num_stages": 3}, "return_idx"),
    ],
)
def test_unsupported_settings_are_one_line(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        ResNet(**kwargs)


def test_fpn_without_extra_convs_subsamples_p5():
    fpn = FPN([8, 16], 4, spatial_scales=[1 / 16, 1 / 32])
    outs = fpn([torch.randn(1, 8, 8, 8), torch.randn(1, 16, 4, 4)])
    assert [o.shape[-1] for o in outs] == [8, 4, 2] and fpn.out_strides == [16, 32, 64]
    torch.testing.assert_close(outs[2], outs[1][:, :, ::2, ::2], rtol=0, atol=0)
    with pytest.raises(ConfigError, match="norm_type"):
        FPN([8], 4, norm_type="gn")


def test_a_training_step_of_resnet_and_fpn_reads_nothing_on_the_host():
    model = BaseModel(
        {
            "model_type": "det",
            "Backbone": {"name": "ResNet", "depth": 18, "variant": "d", "freeze_at": 0, "freeze_norm": False},
            "Neck": {"name": "FPN", "out_channel": 8},
        }
    ).train()
    x = torch.randn(2, 3, 64, 64)
    with HostSyncCounter() as counter:
        outs = model(x)
        sum(o.float().mean() for o in outs).backward()
    assert counter.count == 0, counter.report()
