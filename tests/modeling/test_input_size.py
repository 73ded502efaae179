"""The smallest input a model declares (``ppdist.modeling.input_size``) is the true one: SegFormer's
MiT runs at it and fails one pixel under it on either axis; wrappers and sub-models are seen."""

import pytest
import torch
from torch import nn

from ppdist.modeling.backbones.mix_transformer import MixVisionTransformer
from ppdist.modeling.input_size import conv_output_size, min_input_size
from ppdist.utils.input_size import describe_too_small, too_small


def tiny_mit(sr_ratios):
    return MixVisionTransformer([8, 8, 8, 8], [1, 1, 1, 1], [1, 1, 1, 1], sr_ratios=sr_ratios).eval()


@pytest.mark.parametrize("sr_ratios, expected", [((8, 4, 2, 1), 29), ((4, 2, 1, 1), 13), ((1, 1, 1, 1), 1)])
def test_the_mit_declares_the_smallest_image_it_runs_on(sr_ratios, expected):
    model = tiny_mit(sr_ratios)
    assert min_input_size(model) == (expected, expected)
    with torch.no_grad():
        model(torch.zeros(1, 3, expected, expected))
        model(torch.zeros(1, 3, expected, 3 * expected))
        if expected > 1:
            for shape in ((expected - 1, 3 * expected), (3 * expected, expected - 1)):
                with pytest.raises(RuntimeError):
                    model(torch.zeros(1, 3, *shape))


def test_the_largest_declaration_counts_also_inside_wrappers():
    class Student(nn.Module):
        def __init__(self, backbone):
            super().__init__()
            self.backbone = backbone

    pair = nn.ModuleDict(
        {"Teacher": Student(tiny_mit((4, 2, 1, 1))), "Student": Student(tiny_mit((8, 4, 2, 1)))}
    )
    assert min_input_size(nn.Sequential(pair)) == (29, 29)
    assert min_input_size(nn.Conv2d(3, 3, 3)) is None


def test_size_helpers():
    assert conv_output_size(29, 7, 4, 3) == 8 and conv_output_size(28, 7, 4, 3) == 7
    assert (
        too_small((28, 40), (29, 29)) and too_small((40, 28), (29, 29)) and not too_small((29, 29), (29, 29))
    )
    assert not too_small((1, 1), None)
    assert describe_too_small((1, 2), (29, 29), "after preprocessing").startswith(
        "the image is 1x2 (HxW) after preprocessing, smaller than the model's smallest input 29x29"
    )
