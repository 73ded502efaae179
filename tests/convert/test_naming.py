"""Paddle names declared on the stage classes (PaddleNames) and read by the converter's naming."""

import torch
from torch import nn

from ppdist.convert.weights.naming import apply_renames, paddle_candidates, stage_constants, stage_renames
from ppdist.modeling.paddle_names import PaddleNames


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 1, 1)


class Renamed(nn.Module):
    paddle_names = PaddleNames(
        renames=((r"^(.+)\.bn\.(\w+)$", r"\1._batch_norm.\2"),),
        prefix="paddle_head",
        beside_stage=("extra",),
        constants=(("frozen.weight", "fixed"),),
    )

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Module()
        self.block.bn = nn.BatchNorm2d(1)
        self.extra = nn.Linear(1, 1)
        self.register_buffer("fixed", torch.arange(3.0), persistent=False)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = Plain()
        self.neck = None
        self.head = Renamed()


def test_stage_declarations_rename_prefix_and_place_keys():
    model = Model()
    renames = stage_renames(model)
    assert list(renames) == ["head"]
    assert apply_renames("backbone.conv1.weight", renames) == "backbone.conv1.weight"
    assert apply_renames("head.block.bn.weight", renames) == "paddle_head.block._batch_norm.weight"
    assert apply_renames("head.extra.weight", renames) == "extra.weight"
    assert paddle_candidates(model, "head.block.bn.running_var", renames) == [
        "paddle_head.block._batch_norm._variance"
    ]


def test_declared_constants_get_the_stage_names():
    model = Model()
    [(key, attribute, value)] = stage_constants(model)
    assert (key, attribute) == ("paddle_head.frozen.weight", "head.fixed")
    assert torch.equal(value, torch.arange(3.0))
    assert stage_constants(model, "backbone") == []
