"""Test-time options: whole image, scales, flips and sliding windows."""

import os

import pytest
import torch
from torch import nn

from ppdist.config import load_config
from ppdist.errors import ConfigError
from ppdist.postprocess.seg import SegPostProcess


class PixelModel(nn.Module):
    """Per-pixel linear model: logits depend only on each pixel, so any tiling is exact."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 1)
        self.calls = []

    def forward(self, x):
        self.calls.append(tuple(x.shape[2:]))
        return [self.conv(x)]


def test_slide_equals_whole_image_for_a_pixelwise_model_and_covers_edges():
    model = PixelModel()
    image = torch.randn(2, 3, 37, 53)
    whole = SegPostProcess().infer(model, {"image": image})
    model.calls.clear()
    slide = SegPostProcess(is_slide=True, crop_size=[20, 16], stride=[15, 10]).infer(model, {"image": image})
    assert torch.allclose(whole, slide, atol=1e-5)
    # rows: ceil((37-16)/10)+1 = 4, cols: ceil((53-20)/15)+1 = 4; every window full size
    assert len(model.calls) == 16 and set(model.calls) == {(16, 20)}


def test_flips_are_undone_and_scales_resized_back():
    model = PixelModel()
    image = torch.randn(1, 3, 20, 30)
    whole = SegPostProcess().infer(model, {"image": image})
    flipped = SegPostProcess(aug_eval=True, flip_horizontal=True, flip_vertical=True).infer(
        model, {"image": image}
    )
    assert torch.allclose(whole, flipped, atol=1e-5)
    model.calls.clear()
    scaled = SegPostProcess(aug_eval=True, scales=[0.5, 0.75]).infer(model, {"image": image})
    assert model.calls == [(10, 15), (15, 23)] and tuple(scaled.shape) == (1, 4, 20, 30)


def test_scales_ignored_without_aug_eval_and_argmax_at_label_size():
    model = PixelModel()
    post = SegPostProcess(scales=0.5)
    image = torch.randn(1, 3, 8, 8)
    logits = post.infer(model, {"image": image})
    assert model.calls == [(8, 8)]
    pred = post(logits, {"image": image, "label": torch.zeros(1, 16, 16, dtype=torch.long)})
    assert tuple(pred.shape) == (1, 16, 16) and pred.dtype == torch.int64


QUICKSTART = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "configs",
    "seg",
    "quickstart_synth.yml",
)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["PostProcess.is_slide=true"],
            r"^\S*quickstart_synth.yml: PostProcess.is_slide: true needs PostProcess.crop_size, the \[w, h\] window size$",
        ),
        (
            ["PostProcess.is_slide=true", "PostProcess.crop_size=[48,40]"],
            r"^\S*quickstart_synth.yml: PostProcess.is_slide: true needs PostProcess.stride, the \[w, h\] step between windows$",
        ),
        (
            ["PostProcess.crop_size=[48]"],
            r"^\S*quickstart_synth.yml: PostProcess.crop_size must be \[w, h\], two positive integers, got \[48\]$",
        ),
        (
            ["PostProcess.crop_size=[48.5,40]"],
            r"^\S*quickstart_synth.yml: PostProcess.crop_size must be \[w, h\], two positive",
        ),
        (
            ["PostProcess.stride=[0,24]"],
            r"^\S*quickstart_synth.yml: PostProcess.stride must be \[w, h\], two positive integers, got \[0, 24\]$",
        ),
        (
            ["PostProcess.is_slide=true", "PostProcess.crop_size=[48,40]", "PostProcess.stride=[32,41]"],
            r"^\S*quickstart_synth.yml: PostProcess.stride \[32, 41\] must not exceed PostProcess.crop_size \[48, 40\] in width or height",
        ),
        (
            ["PostProcess.scales=[]"],
            r"^\S*quickstart_synth.yml: PostProcess.scales must be a positive number or a non-empty list",
        ),
        (
            ["PostProcess.scales=[0.75,-1.0]"],
            r"^\S*quickstart_synth.yml: PostProcess.scales must be a positive number .*got \[0.75, -1.0\]$",
        ),
    ],
)
def test_bad_test_config_values_fail_config_validation_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(QUICKSTART, overrides)
    assert "\n" not in str(info.value)


def test_the_constructor_refuses_the_same_values():
    with pytest.raises(ConfigError, match=r"^PostProcess.is_slide: true needs PostProcess.crop_size"):
        SegPostProcess(is_slide=True, stride=[8, 8])
    with pytest.raises(ConfigError, match=r"^PostProcess.scales must be"):
        SegPostProcess(scales=[])


def test_a_scale_that_makes_an_empty_image_is_one_config_error_naming_it():
    """--scales 0.001 on a 40x60 image would be 0x0 pixels: a ConfigError naming the scale and
    the smallest scale that works for the image, not an error from inside the resize."""
    image = torch.rand(1, 3, 40, 60)
    with pytest.raises(
        ConfigError,
        match=r"scale 0.001 makes the 40x60 input 0x0 pixels, under the model.s smallest input 1x1; use scales of at least 0.0125",
    ):
        SegPostProcess(aug_eval=True, scales=[1.0, 0.001]).infer(PixelModel(), {"image": image})
    logits = SegPostProcess(aug_eval=True, scales=[0.0125]).infer(PixelModel(), {"image": image})
    assert logits.shape == (1, 4, 40, 60)
