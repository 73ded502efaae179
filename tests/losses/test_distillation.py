"""The pair losses of distillation on outputs of two shapes (a Teacher of another backbone scale):
one error naming the loss, the key and both shapes, not a broadcasting error inside torch."""

import pytest
import torch

from ppdist.errors import ConfigError
from ppdist.losses.distillation import DistillationDistanceLoss, DistillationDMLLoss


def test_the_distance_loss_names_the_key_and_both_shapes():
    loss = DistillationDistanceLoss(mode="l2", model_name_pairs=[["Student", "Teacher"]], key="backbone_out")
    preds = {
        "Student": {"backbone_out": torch.zeros(2, 480, 1, 40)},
        "Teacher": {"backbone_out": torch.zeros(2, 960, 1, 40)},
    }
    with pytest.raises(ConfigError) as caught:
        loss(preds)
    assert str(caught.value) == (
        "DistillationDistanceLoss 'loss_distance_l2': 'backbone_out' of Student has shape (2, 480, 1, 40) and of "
        "Teacher (2, 960, 1, 40); the loss compares them element by element: give both models outputs of one "
        "shape there (e.g. the same Backbone scale), or remove this loss"
    )


def test_the_dml_loss_names_the_branch_too():
    loss = DistillationDMLLoss(
        model_name_pairs=[["Student", "Teacher"]],
        act="softmax",
        use_log=True,
        key="head_out",
        multi_head=True,
        dis_head="sar",
        name="dml_sar",
    )
    preds = {
        "Student": {"head_out": {"sar": torch.zeros(2, 25, 40)}},
        "Teacher": {"head_out": {"sar": torch.zeros(2, 30, 40)}},
    }
    with pytest.raises(
        ConfigError,
        match=r"^DistillationDMLLoss 'dml_sar': 'head_out.sar' of Student has shape "
        r"\(2, 25, 40\) and of Teacher \(2, 30, 40\);",
    ):
        loss(preds)


def test_outputs_of_one_shape_give_the_loss():
    loss = DistillationDistanceLoss(mode="l2", model_name_pairs=[["Student", "Teacher"]], key="backbone_out")
    preds = {"Student": {"backbone_out": torch.ones(2, 3)}, "Teacher": {"backbone_out": torch.zeros(2, 3)}}
    assert loss(preds) == {"loss_distance_l2_Student_Teacher_0": torch.tensor(1.0)}
