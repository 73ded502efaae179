"""OCRNet-HRNet: PaddleSeg's parameter counts, Paddle's 'same' stride-2 padding, train/eval outputs,
config errors, and a training step that reads nothing on the host."""

import json
import os

import pytest
import torch
import torch.nn.functional as F
from ppdist_testing import paddle_fixture_dir
from torch.utils._python_dispatch import TorchDispatchMode

import ppdist.components  # noqa: F401  (registers the stages)
from ppdist.errors import ConfigError
from ppdist.modeling.architectures import BaseModel
from ppdist.modeling.backbones.hrnet import ConvNorm, FuseLayers, SameStride2Conv
from ppdist.registry import BACKBONES
from ppdist.utils.host_sync import count_host_syncs

with open(os.path.join(paddle_fixture_dir("ocrnet"), "param_counts.json")) as _f:
    PADDLE_COUNTS = json.load(_f)  # counted with Paddle by tests/fixtures/paddle_ocrnet/make_fixtures.py


def ocrnet(backbone: str = "HRNet_W18", num_classes: int = 19, **head) -> BaseModel:
    head = {"name": "OCRHead", "num_classes": num_classes, "backbone_indices": [0], **head}
    return BaseModel({"model_type": "seg", "Backbone": {"name": backbone}, "Head": head})


def trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.fixture
def counting_only(monkeypatch):
    """Build on the meta device (no memory) without the inits (slow there): the shapes are what count."""
    monkeypatch.setattr(torch.nn.init, "normal_", lambda tensor, *args, **kwargs: tensor)
    with torch.device("meta"):
        yield


@pytest.mark.parametrize("backbone", ["HRNet_W18", "HRNet_W48"])
def test_ocrnet_parameter_count_equals_paddleseg(backbone, counting_only):
    model = ocrnet(backbone)
    assert trainable(model) == PADDLE_COUNTS["OCRNet"][backbone]["total"]
    assert trainable(model.backbone) == PADDLE_COUNTS["OCRNet"][backbone]["backbone"]


# the small layouts, SE, and the widest: the other HRNet_W<w> are the same code at other widths
# (param_counts.json has all ten factories with and without SE; each build takes ~0.5 s)
FACTORIES = [
    "HRNet_W18_Small_V1",
    "HRNet_W18_Small_V1_se",
    "HRNet_W18_Small_V2_se",
    "HRNet_W30",
    "HRNet_W64_se",
]


def test_hrnet_factories_count_as_paddleseg(counting_only):
    assert len(PADDLE_COUNTS["HRNet"]) == 20 and set(FACTORIES) < set(PADDLE_COUNTS["HRNet"])
    for name in FACTORIES:
        backbone = BACKBONES.build({"name": name.removesuffix("_se"), "has_se": name.endswith("_se")})
        assert trainable(backbone) == PADDLE_COUNTS["HRNet"][name], name


@pytest.mark.parametrize("size", [(8, 10), (9, 7), (1, 2)])
def test_same_stride2_conv_pads_as_paddle(size):
    """Paddle's 'same': out = ceil(n / 2), padding (n % 2) before and 1 after; a traced graph (what
    export writes) pads each input by its own parity."""
    torch.manual_seed(0)
    conv = SameStride2Conv(3, 4)
    x = torch.randn(2, 3, *size)
    h, w = size
    reference = F.conv2d(F.pad(x, (w % 2, 1, h % 2, 1)), conv.weight, stride=2)
    assert tuple(reference.shape[2:]) == ((h + 1) // 2, (w + 1) // 2)
    with torch.no_grad():
        assert torch.allclose(conv(x), reference, atol=1e-6)
        traced = torch.jit.trace(conv, x)
        other = torch.randn(1, 3, h + 1, w + 3)  # the other parities, through the same traced graph
        expected = F.conv2d(F.pad(other, ((w + 3) % 2, 1, (h + 1) % 2, 1)), conv.weight, stride=2)
        assert torch.allclose(traced(other), expected, atol=1e-6)
    # padding_same=False: PaddleSeg's symmetric padding 1
    plain = ConvNorm(3, 4, 3, 2, padding_same=False).conv
    assert type(plain) is torch.nn.Conv2d and plain.padding == (1, 1)


def test_fuse_pads_each_branch_once_for_every_path_down_from_it():
    """Four branches: the six paths down (1->2, 1->3, 1->4, 2->3, 2->4, 3->4) open with a 'same'
    stride-2 conv on their source branch: 3 copies for those (one per source), not 6, plus one for
    each later conv of a chain (4); the outputs those of each path padding its own input."""

    class Pads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Pads.count += func.overloadpacket.__name__ == "constant_pad_nd"
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    fuse = FuseLayers([2, 3, 4, 5], "t", align_corners=False, padding_same=True).eval()
    x = [torch.randn(1, c, 16 // 2**i, 12 // 2**i) for i, c in enumerate([2, 3, 4, 5])]
    with torch.no_grad(), Pads():
        outs = fuse(x)
    assert Pads.count == 3 + 4
    with torch.no_grad():  # every layer on its own input (its own 'same' padding)
        for i, out in enumerate(outs):
            expected = x[i]
            for j in range(4):
                y = x[j]
                for key in fuse._paths.get((i, j), []):
                    y = getattr(fuse, key)(y)
                if j > i:
                    y = F.interpolate(y, x[i].shape[-2:], mode="bilinear", align_corners=False)
                expected = expected + y if j != i else expected
            torch.testing.assert_close(out, F.relu(expected), rtol=0, atol=0)


def small_ocrnet(**head) -> BaseModel:
    torch.manual_seed(0)
    settings = {"ocr_mid_channels": 16, "ocr_key_channels": 8, **head}
    return ocrnet("HRNet_W18_Small_V1", num_classes=5, **settings)


def test_train_returns_main_and_soft_regions_eval_the_main_only():
    model = small_ocrnet()
    x = torch.randn(2, 3, 45, 62)
    outs = model(x)
    assert [tuple(o.shape) for o in outs] == [(2, 5, 45, 62)] * 2
    assert not torch.equal(outs[0], outs[1])
    model.eval()
    with torch.no_grad():
        outs = model({"image": x[:1]})
    assert [tuple(o.shape) for o in outs] == [(1, 5, 45, 62)]


def test_two_backbone_indices_take_the_first_for_the_soft_regions():
    model = small_ocrnet(backbone_indices=[0, 0])
    assert model.head.aux_head[0].conv.in_channels == 240 == model.head.conv3x3_ocr.conv.in_channels
    with pytest.raises(ConfigError, match=r"backbone_indices must hold 1 or 2 indices .* got \[0, 1\]"):
        small_ocrnet(backbone_indices=[0, 1])
    with pytest.raises(ConfigError, match="backbone_indices"):
        small_ocrnet(backbone_indices=[0, 0, 0])


def test_training_step_reads_nothing_on_the_host():
    """The GPU never waits: OCRNet's forward (train mode, both outputs) and backward read no device value."""
    model = small_ocrnet().train()
    x = torch.randn(2, 3, 17, 22)

    def step():
        main, soft_regions = model(x)
        (main.mean() + 0.4 * soft_regions.mean()).backward()

    counter = count_host_syncs(step)
    assert counter.count == 0, counter.report()
