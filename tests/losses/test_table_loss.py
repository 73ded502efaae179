"""SLANet's SLALoss equals PaddleOCR's (tests/fixtures/paddle_table/make_eval_fixture.py): the three
terms and the gradients w.r.t. the logits and boxes; the mse variant, the mask layouts, fp32 under
autocast, no host read, and one clear error for a bad ``loc_loss``."""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ppdist.components import build_loss
from ppdist.errors import ConfigError
from ppdist.losses import SLALoss
from ppdist.utils.host_sync import HostSyncCounter

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "paddle_table", "eval_fixture.npz")
TOL = 1e-5


@pytest.fixture(scope="module")
def case():
    with np.load(FIXTURE) as data:
        return {k[len("loss/") :]: data[k] for k in data.files if k.startswith("loss/")}


def _inputs(case, masks_2d=False):
    preds = {
        "structure_probs": torch.tensor(case["structure_logits"], requires_grad=True),
        "loc_preds": torch.tensor(case["loc_preds"], requires_grad=True),
    }
    masks = case["bbox_masks"][..., 0] if masks_2d else case["bbox_masks"]
    batch = {
        "structure": torch.tensor(case["structure"]),
        "bboxes": torch.tensor(case["bboxes"]),
        "bbox_masks": torch.tensor(masks),
    }
    return preds, batch


@pytest.mark.parametrize("masks_2d", [False, True])
def test_terms_and_gradients_equal_paddle(case, masks_2d):
    loss = build_loss(
        {"Loss": {"name": "SLALoss", "structure_weight": 1.0, "loc_weight": 2.0, "loc_loss": "smooth_l1"}}
    )
    preds, batch = _inputs(case, masks_2d)
    out = loss(preds, batch)
    assert sorted(out) == ["loc_loss", "loss", "structure_loss"]
    for key in ("loss", "structure_loss", "loc_loss"):
        assert abs(out[key].item() - float(case[key])) < TOL, key
    out["loss"].backward()
    np.testing.assert_allclose(preds["structure_probs"].grad.numpy(), case["grad_logits"], atol=1e-6)
    np.testing.assert_allclose(preds["loc_preds"].grad.numpy(), case["grad_loc"], atol=1e-6)


def test_mse_location_loss_and_weights(case):
    preds, batch = _inputs(case)
    out = SLALoss(structure_weight=0.5, loc_weight=3.0, loc_loss="mse")(preds, batch)
    masks = batch["bbox_masks"][:, 1:]
    squared = ((preds["loc_preds"] - batch["bboxes"][:, 1:]) * masks) ** 2
    expected = squared.sum() * 3.0 / masks.sum()
    assert torch.allclose(out["loc_loss"], expected, atol=1e-6)
    assert abs(out["structure_loss"].item() - 0.5 * float(case["structure_loss"])) < TOL


def test_full_precision_under_autocast_and_no_host_read(case):
    preds, batch = _inputs(case)
    preds = {k: v.detach().to(torch.bfloat16).requires_grad_() for k, v in preds.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16), HostSyncCounter() as counter:
        out = SLALoss(1.0, 2.0, "smooth_l1")(preds, batch)
        out["loss"].backward()
    assert counter.count == 0, counter.report()
    assert out["loss"].dtype == torch.float32
    expected = F.cross_entropy(preds["structure_probs"].float().transpose(1, 2), batch["structure"][:, 1:])
    assert torch.allclose(out["structure_loss"], expected)


def test_bad_config_is_one_clear_error():
    with pytest.raises(ConfigError, match=r"Loss.loc_loss: expected one of \('smooth_l1', 'mse'\), got 'l1'"):
        build_loss(
            {"Loss": {"name": "SLALoss", "structure_weight": 1.0, "loc_weight": 2.0, "loc_loss": "l1"}}
        )


def test_wrong_structure_length_names_the_shapes(case):
    preds, batch = _inputs(case)
    batch["structure"] = batch["structure"][:, :-1]
    with pytest.raises(ValueError, match=r"batch\['structure'\] \(B, 8\) for structure_probs \(2, 7, 30\)"):
        SLALoss(1.0, 2.0, "smooth_l1")(preds, batch)
