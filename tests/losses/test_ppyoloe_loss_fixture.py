"""The fixed-shape (sync-free) PP-YOLOE loss equals the boolean-indexing one it replaced, terms and
gradients, and reads nothing on the host in either assigner phase."""

import importlib.util
import os

import pytest
import torch

from ppdist.losses import PPYOLOELoss
from ppdist.utils.host_sync import HostSyncCounter

FIXTURE_DIR = os.path.join(os.path.dirname(__file__), "..", "fixtures", "ppyoloe_loss")
spec = importlib.util.spec_from_file_location(
    "make_ppyoloe_fixture", os.path.join(FIXTURE_DIR, "make_fixture.py")
)
fixture = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fixture)
RECORDS = torch.load(os.path.join(FIXTURE_DIR, "loss_terms.pt"), weights_only=True)


@pytest.mark.parametrize("index", range(len(RECORDS)))
def test_terms_and_gradients_equal_the_boolean_indexing_loss(index):
    record = RECORDS[index]
    result = fixture.run(record["case"], record["epoch_id"], record["varifocal"])
    for name, want in record["result"].items():
        torch.testing.assert_close(result[name], want, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("epoch_id", [0, 200])
@pytest.mark.parametrize("spec_index", range(len(fixture.CASES)))
def test_forward_and_backward_read_nothing_on_the_host(epoch_id, spec_index):
    spec = fixture.CASES[spec_index]
    data = fixture.case(**spec)
    preds = dict(data["preds"])
    preds["cls_logits"].requires_grad_(True)
    preds["reg_distri"].requires_grad_(True)
    loss = PPYOLOELoss(num_classes=spec["num_classes"])
    with HostSyncCounter() as counter:
        out = loss(preds, dict(data["batch"], epoch_id=epoch_id))
        out["loss"].backward()
    assert counter.count == 0, counter.report()
    assert torch.isfinite(preds["reg_distri"].grad).all() and torch.isfinite(preds["cls_logits"].grad).all()


def test_no_positive_anywhere_gives_zero_box_losses_and_finite_gradients():
    data = fixture.case(seed=4, size=64, num_classes=3, batch=2, boxes=2, empty=True)
    data["batch"]["pad_gt_mask"].zero_()
    preds = dict(data["preds"])
    preds["reg_distri"].requires_grad_(True)
    out = PPYOLOELoss(num_classes=3)(preds, dict(data["batch"], epoch_id=0))
    assert all(float(out[k]) == 0.0 for k in ("loss_l1", "loss_iou", "loss_dfl"))
    out["loss"].backward()
    assert torch.equal(preds["reg_distri"].grad, torch.zeros_like(preds["reg_distri"]))


def test_dfl_projection_is_fp32_under_autocast():
    spec = fixture.CASES[0]
    data = fixture.case(**spec)
    batch = dict(data["batch"], epoch_id=200)
    loss = PPYOLOELoss(num_classes=spec["num_classes"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = loss(data["preds"], batch)
    outside = loss(data["preds"], batch)
    for name, value in outside.items():
        assert inside[name].dtype == torch.float32 and torch.equal(inside[name], value), name
